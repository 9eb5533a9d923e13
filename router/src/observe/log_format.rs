//! How a log line is written, in the log's two shapes: JSON (`{"timestamp", "level", "fields",
//! "target", "span", "spans"}`, one object per line) and text (`timestamp LEVEL span{..}: target:
//! message key=value ...`). Both are written straight into the line, field by field, instead of
//! through a map of values or a padded, coloured template: an access line per request made the
//! formatter a cost of every request.
//!
//! What a client chose (a path, a request id, a tenant) can hold any character: JSON escapes
//! it, text escapes control characters (no terminal escape sequence gets through), and a text
//! value with a space, a quote or an `=` is quoted, so `key=value` pairs stay parseable. Colour
//! only where stderr is a terminal.

mod number;

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::log_context;

/// A line's shape; the event formatter, and (through [`LineFormat::fields`]) the span fields'.
#[derive(Clone, Copy, Debug)]
pub struct LineFormat {
    json: bool,
    ansi: bool,
}

impl LineFormat {
    pub fn json() -> Self {
        LineFormat {
            json: true,
            ansi: false,
        }
    }

    /// Text, coloured (the level) when `ansi`.
    pub fn text(ansi: bool) -> Self {
        LineFormat { json: false, ansi }
    }

    /// How a span's fields are kept for its lines, in the same shape.
    pub fn fields(self) -> SpanFields {
        SpanFields { json: self.json }
    }
}

/// Whether text lines may be coloured: stderr is a terminal and `NO_COLOR` is not set.
pub fn stderr_is_a_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// A span's fields, formatted once when the span starts (JSON: `"k":v,...` without braces).
#[derive(Clone, Copy, Debug)]
pub struct SpanFields {
    json: bool,
}

impl<'w> FormatFields<'w> for SpanFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        // A new span's fields: formatted in a buffer of this thread's and handed over whole, so
        // the span's own string is allocated once at its size, not grown write by write.
        thread_local! {
            static SPAN: RefCell<String> = const { RefCell::new(String::new()) };
        }
        with_buffer(&SPAN, |buf| {
            let mut v = Fields::new(buf, self.json, false);
            fields.record(&mut v);
            v.result?;
            writer.write_str(buf)
        })
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let first = current.fields.is_empty();
        let mut v = Fields::new(&mut current.fields, self.json, false);
        v.first = first;
        fields.record(&mut v);
        v.result
    }
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Built in a buffer of this thread's (a `String`, whose pushes inline) and handed over
        // in one piece; the writer behind `w` is reached through a `dyn` call per write.
        thread_local! {
            static LINE: RefCell<String> = const { RefCell::new(String::new()) };
        }
        with_buffer(&LINE, |line| {
            self.line(line, ctx, event)?;
            w.write_str(line)
        })
    }
}

impl LineFormat {
    fn line<S, N>(
        &self,
        w: &mut String,
        ctx: &FmtContext<'_, S, N>,
        event: &Event<'_>,
    ) -> fmt::Result
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        let meta = event.metadata();
        if self.json {
            w.push_str("{\"timestamp\":\"");
            timestamp(w)?;
            w.push_str("\",\"level\":\"");
            w.push_str(meta.level().as_str());
            w.push_str("\",\"fields\":{");
            let mut v = Fields::new(w, true, true);
            event.record(&mut v);
            v.result?;
            w.push_str("},\"target\":");
            json_str(w, meta.target())?;
            // `"span"` is the innermost, `"spans"` all of them from the root: the request the
            // line was written in, then tracing's spans.
            let mut spans = String::new();
            let mut leaf = 0..0;
            log_context::with_current(|r| match r {
                Some(r) => {
                    spans.push_str("{\"id\":");
                    json_str(&mut spans, &r.id)?;
                    spans.push_str(",\"method\":");
                    json_str(&mut spans, &r.method)?;
                    spans.push_str(",\"path\":");
                    json_str(&mut spans, &r.path)?;
                    spans.push_str(",\"name\":\"request\"}");
                    leaf = 0..spans.len();
                    Ok(())
                }
                None => Ok(()),
            })?;
            if let Some(scope) = ctx.event_scope() {
                for span in scope.from_root() {
                    if !spans.is_empty() {
                        spans.push(',');
                    }
                    let start = spans.len();
                    spans.push('{');
                    if let Some(f) = span.extensions().get::<FormattedFields<N>>()
                        && !f.fields.is_empty()
                    {
                        spans.push_str(&f.fields);
                        spans.push(',');
                    }
                    spans.push_str("\"name\":");
                    json_str(&mut spans, span.name())?;
                    spans.push('}');
                    leaf = start..spans.len();
                }
            }
            if !spans.is_empty() {
                w.push_str(",\"span\":");
                w.push_str(&spans[leaf]);
                w.push_str(",\"spans\":[");
                w.push_str(&spans);
                w.push(']');
            }
            w.push_str("}\n");
        } else {
            timestamp(w)?;
            w.push(' ');
            level(w, meta.level(), self.ansi)?;
            w.push(' ');
            let mut any = log_context::with_current(|r| match r {
                Some(r) => {
                    w.push_str("request{id=");
                    text_value(w, &r.id)?;
                    w.push_str(" method=");
                    text_value(w, &r.method)?;
                    w.push_str(" path=");
                    text_value(w, &r.path)?;
                    w.push_str("}:");
                    Ok::<_, fmt::Error>(true)
                }
                None => Ok(false),
            })?;
            if let Some(scope) = ctx.event_scope() {
                for span in scope.from_root() {
                    w.push_str(span.name());
                    if let Some(f) = span.extensions().get::<FormattedFields<N>>()
                        && !f.fields.is_empty()
                    {
                        w.push('{');
                        w.push_str(&f.fields);
                        w.push('}');
                    }
                    w.push(':');
                    any = true;
                }
            }
            if any {
                w.push(' ');
            }
            w.push_str(meta.target());
            w.push_str(": ");
            let mut v = Fields::new(w, false, true);
            event.record(&mut v);
            v.result?;
            w.push('\n');
        }
        Ok(())
    }
}

/// Most of a buffer's capacity a thread keeps between lines: one long line (a large debug
/// value) is not held for the thread's life.
const KEEP_BYTES: usize = 16 * 1024;

/// Runs `f` on the thread's buffer `key`, cleared, or on a new string should a log call made
/// inside `f` (a value's `Debug` that logs) find the buffer in use; tracing drops such calls
/// today, so that is a guard, not a path.
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<RefCell<String>>,
    f: impl FnOnce(&mut String) -> R,
) -> R {
    key.with(|buf| match buf.try_borrow_mut() {
        Ok(mut buf) => {
            reuse(&mut buf);
            f(&mut buf)
        }
        Err(_) => f(&mut String::new()),
    })
}

/// Empties a per-thread buffer for the next line, letting go of a long line's capacity.
fn reuse(buf: &mut String) {
    if buf.capacity() > KEEP_BYTES {
        *buf = String::new();
    } else {
        buf.clear();
    }
}

fn level(w: &mut impl fmt::Write, level: &Level, ansi: bool) -> fmt::Result {
    let (name, colour) = match *level {
        Level::TRACE => ("TRACE", "35"),
        Level::DEBUG => ("DEBUG", "34"),
        Level::INFO => (" INFO", "32"),
        Level::WARN => (" WARN", "33"),
        Level::ERROR => ("ERROR", "31"),
    };
    if ansi {
        write!(w, "\x1b[{colour}m{name}\x1b[0m")
    } else {
        w.write_str(name)
    }
}

/// Writes one event's or span's fields: JSON `"k":v` pairs, or text `k=v` pairs after the
/// message. `event`: the message (a field named `message`) is the line's own, not a pair.
struct Fields<'a, W: fmt::Write> {
    w: &'a mut W,
    json: bool,
    event: bool,
    first: bool,
    message_seen: bool,
    result: fmt::Result,
}

impl<'a, W: fmt::Write> Fields<'a, W> {
    fn new(w: &'a mut W, json: bool, event: bool) -> Self {
        Fields {
            w,
            json,
            event,
            first: true,
            message_seen: false,
            result: Ok(()),
        }
    }

    /// Writes the key (and its separator). A second field named `message` (an explicit field
    /// beside the format string's) is written as `message.1`: JSON keeps one value per key.
    fn key(&mut self, field: &Field) -> fmt::Result {
        let mut name = field.name();
        if name == "message" {
            if self.message_seen {
                name = "message.1";
            }
            self.message_seen = true;
        }
        let first = std::mem::replace(&mut self.first, false);
        if self.json {
            // Field names are the code's own and rarely need escaping: written as they are
            // when they do not.
            if !name.bytes().any(|b| JSON_ESCAPED[usize::from(b)]) {
                self.w.write_str(if first { "\"" } else { ",\"" })?;
                self.w.write_str(name)?;
                return self.w.write_str("\":");
            }
            if !first {
                self.w.write_char(',')?;
            }
            json_str(self.w, name)?;
            self.w.write_char(':')
        } else {
            if !first {
                self.w.write_char(' ')?;
            }
            self.w.write_str(name)?;
            self.w.write_char('=')
        }
    }

    /// Whether this field is the text line's message (written bare, before the pairs).
    fn text_message(&mut self, field: &Field) -> bool {
        if self.json || !self.event || self.message_seen || field.name() != "message" {
            return false;
        }
        self.message_seen = true;
        self.first = false;
        true
    }

    fn str(&mut self, field: &Field, value: &str) -> fmt::Result {
        if self.text_message(field) {
            return Escaped(self.w).write_str(value);
        }
        self.key(field)?;
        if self.json {
            json_str(self.w, value)
        } else {
            text_value(self.w, value)
        }
    }

    /// A value written as it formats (a number, a boolean); the first error stops the rest.
    fn raw(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        self.number(field, |w| w.write_fmt(value));
    }

    /// A value (a number) written by `write`, bare; the first error stops the rest.
    fn number(&mut self, field: &Field, write: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.key(field);
        }
        if self.result.is_ok() {
            self.result = write(self.w);
        }
    }

    fn debug(&mut self, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
        if self.text_message(field) {
            return write!(Escaped(self.w), "{value:?}");
        }
        self.key(field)?;
        if self.json {
            self.w.write_char('"')?;
            write!(JsonEscaped(self.w), "{value:?}")?;
            self.w.write_char('"')
        } else {
            // Formatted once into a small buffer to see whether it needs quotes.
            thread_local! {
                static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
            }
            with_buffer(&SCRATCH, |s| {
                write!(s, "{value:?}")?;
                text_value(self.w, s)
            })
        }
    }
}

impl<W: fmt::Write> Visit for Fields<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_ok() {
            self.result = self.str(field, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_ok() {
            self.result = self.debug(field, value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.number(field, |w| number::write_u64(w, value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, |w| number::write_i64(w, value));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity; text writes what Rust prints.
        if self.json && !value.is_finite() {
            self.raw(field, format_args!("null"));
        } else {
            self.number(field, |w| number::write_f64(w, value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_ok() {
            self.result = self.debug(field, &format_args!("{value}"));
        }
    }
}

/// A text value: bare when it has no space, quote, `=` or control character, else quoted
/// with Rust's escapes (the quotes and backslashes escaped, control characters as `\u{..}`).
fn text_value(w: &mut impl fmt::Write, value: &str) -> fmt::Result {
    let bare = !value.is_empty()
        && (find_marked(value.as_bytes(), &TEXT_NOT_PLAIN, text_not_plain_in).is_none()
            || !value
                .chars()
                .any(|c| c == ' ' || c == '"' || c == '=' || c == '\\' || c.is_control()));
    if bare {
        w.write_str(value)
    } else {
        write!(w, "{value:?}")
    }
}

/// The bytes a text value may not hold bare: all but printable ASCII, and space, `"`, `=` and
/// `\` (a value with any of them is checked character by character).
static TEXT_NOT_PLAIN: [bool; 256] = {
    let mut t = [true; 256];
    let mut b = 0x21;
    while b < 0x7f {
        t[b] = matches!(b as u8, b'"' | b'=' | b'\\');
        b += 1;
    }
    t
};

/// Eight `0x01` bytes; `ONES * b` is eight `b` bytes.
const ONES: u64 = 0x0101_0101_0101_0101;
/// The high bit of each of eight bytes.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` below `n` (`n` ≤ 128) is set in the result (and maybe of
/// bytes above one that is): non-zero exactly when some byte is below `n`.
const fn bytes_below(w: u64, n: u8) -> u64 {
    w.wrapping_sub(ONES * n as u64) & !w & HIGH
}

/// Non-zero exactly when some byte of `w` is `b`.
const fn bytes_equal(w: u64, b: u8) -> u64 {
    bytes_below(w ^ (ONES * b as u64), 1)
}

/// Whether the word holds a byte [`JSON_ESCAPED`] marks.
fn json_escaped_in(w: u64) -> bool {
    bytes_below(w, 0x20) | bytes_equal(w, b'"') | bytes_equal(w, b'\\') | bytes_equal(w, 0x7f) != 0
}

/// Whether the word holds a byte [`TEXT_NOT_PLAIN`] marks.
fn text_not_plain_in(w: u64) -> bool {
    (w & HIGH)
        | bytes_below(w, 0x21)
        | bytes_equal(w, 0x7f)
        | bytes_equal(w, b'"')
        | bytes_equal(w, b'=')
        | bytes_equal(w, b'\\')
        != 0
}

/// The first byte of `s` that `table` marks. Eight bytes are looked at at once: `word_has`
/// says whether a word (little-endian) holds a marked byte, and only such a word is searched
/// byte by byte — log values are mostly long runs of bytes written as they are.
fn find_marked(s: &[u8], table: &[bool; 256], word_has: impl Fn(u64) -> bool) -> Option<usize> {
    let marked = |b: &u8| table[usize::from(*b)];
    let mut words = s.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let bytes: [u8; 8] = word.try_into().unwrap_or([0; 8]);
        if word_has(u64::from_le_bytes(bytes))
            && let Some(i) = word.iter().position(marked)
        {
            return Some(at + i);
        }
        at += 8;
    }
    words.remainder().iter().position(marked).map(|i| at + i)
}

/// Writes what it is given with control characters escaped (`\u{1b}`): a text message.
struct Escaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(i) = rest.find(|c: char| c.is_control()) {
            self.0.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or('\0');
            write!(self.0, "{}", c.escape_unicode())?;
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// The bytes a JSON string escapes: control characters, `"`, `\` (and DEL).
static JSON_ESCAPED: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t[0x7f] = true;
    t
};

/// Writes what it is given as the inside of a JSON string.
struct JsonEscaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for JsonEscaped<'_, W> {
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        while let Some(i) = find_marked(s.as_bytes(), &JSON_ESCAPED, json_escaped_in) {
            self.0.write_str(&s[..i])?;
            match s.as_bytes()[i] {
                b'"' => self.0.write_str("\\\"")?,
                b'\\' => self.0.write_str("\\\\")?,
                b'\n' => self.0.write_str("\\n")?,
                b'\r' => self.0.write_str("\\r")?,
                b'\t' => self.0.write_str("\\t")?,
                b => write!(self.0, "\\u{b:04x}")?,
            }
            // The byte escaped is ASCII, so the rest starts on a character boundary.
            s = &s[i + 1..];
        }
        self.0.write_str(s)
    }
}

fn json_str(w: &mut impl fmt::Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    JsonEscaped(w).write_str(s)?;
    w.write_char('"')
}

/// Writes the time now as RFC 3339 in UTC with microseconds (`2026-12-07T08:26:22.394184Z`);
/// the part up to the second is kept per thread and reused within the second.
fn timestamp(w: &mut impl fmt::Write) -> fmt::Result {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    thread_local! {
        static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let secs = now.as_secs();
    SECOND.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 != secs {
            let prefix = &mut s.1;
            prefix.clear();
            second_prefix(prefix, secs)?;
            s.0 = secs;
        }
        w.write_str(&s.1)
    })?;
    write!(w, "{:06}Z", now.subsec_micros())
}

/// `YYYY-MM-DDTHH:MM:SS.` for `secs` since the Unix epoch (UTC, proleptic Gregorian).
fn second_prefix(out: &mut impl fmt::Write, secs: u64) -> fmt::Result {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The calendar date of a day counted from 1970-01-01 (the days-to-civil conversion over
/// 400-year eras of 146,097 days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
