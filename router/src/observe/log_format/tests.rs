use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

use super::*;

/// Collects what the log writes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("capture").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// The lines `emit` logs at `trace` and up, in `format`.
fn lines(format: LineFormat, emit: impl FnOnce()) -> Vec<String> {
    let capture = Capture::default();
    let layer = tracing_subscriber::fmt::layer()
        .event_format(format)
        .fmt_fields(format.fields())
        .with_writer(capture.clone());
    let subscriber = tracing_subscriber::registry()
        .with(layer.with_filter(tracing_subscriber::filter::LevelFilter::TRACE));
    tracing::subscriber::with_default(subscriber, emit);
    let bytes = capture.0.lock().expect("capture").clone();
    String::from_utf8(bytes)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect()
}

use tracing_subscriber::Layer as _;

/// Runs `f` as the router runs a request's future: with its `RequestLog` lent to the thread.
fn in_request(id: &str, path: &str, f: impl FnOnce()) {
    use futures_util::FutureExt;
    let request = Arc::new(crate::observe::log_context::RequestLog {
        id: id.into(),
        method: "POST".into(),
        path: path.into(),
    });
    crate::observe::log_context::in_request(request, async { f() })
        .now_or_never()
        .expect("ready");
}

fn emit_request_lines() {
    in_request("r\"1", "/v1/a b", emit_warning);
}

fn emit_warning() {
    tracing::warn!(
        status = 503u64,
        code = "no_healthy_target",
        latency = 0.25f64,
        nan = f64::NAN,
        negative = -3i64,
        retried = true,
        shown = %"x=y",
        debugged = ?Some(2),
        message = "second message",
        "request \u{1b}[31mfailed"
    );
}

#[test]
fn a_span_inside_a_request_is_listed_after_it_and_no_request_outside() {
    let lines = lines(LineFormat::json(), || {
        in_request("r2", "/v1/x", || {
            let inner = tracing::info_span!("inner", k = 1u64);
            let _i = inner.enter();
            tracing::info!("nested");
        });
        tracing::info!("after");
    });
    let nested: serde_json::Value = serde_json::from_str(&lines[0]).expect("JSON");
    let request =
        serde_json::json!({"id": "r2", "method": "POST", "path": "/v1/x", "name": "request"});
    assert_eq!(nested["span"], serde_json::json!({"k": 1, "name": "inner"}));
    assert_eq!(
        nested["spans"],
        serde_json::json!([request, {"k": 1, "name": "inner"}])
    );
    let after: serde_json::Value = serde_json::from_str(&lines[1]).expect("JSON");
    assert!(after.get("spans").is_none(), "{after}");
    let text = self::lines(LineFormat::text(false), || {
        in_request("r3", "/v1/y", || {
            let inner = tracing::info_span!("inner");
            let _i = inner.enter();
            tracing::info!("nested");
        })
    });
    assert!(
        text[0].contains(" INFO request{id=r3 method=POST path=/v1/y}:inner: "),
        "{}",
        text[0]
    );
}

#[test]
fn json_lines_are_objects_with_every_field_typed_and_the_span_named() {
    let lines = lines(LineFormat::json(), emit_request_lines);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v: serde_json::Value = serde_json::from_str(&lines[0]).expect("one JSON object");
    assert_eq!(v["level"], "WARN");
    assert_eq!(v["target"], module_path!());
    let ts = v["timestamp"].as_str().expect("timestamp");
    assert_eq!(ts.len(), "2026-12-07T08:26:22.394184Z".len(), "{ts}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
    let f = &v["fields"];
    assert_eq!(f["message"], "request \u{1b}[31mfailed");
    assert_eq!(f["message.1"], "second message");
    assert_eq!(f["status"], 503);
    assert_eq!(f["code"], "no_healthy_target");
    assert_eq!(f["latency"], 0.25);
    assert!(f["nan"].is_null());
    assert_eq!(f["negative"], -3);
    assert_eq!(f["retried"], true);
    assert_eq!(f["shown"], "x=y");
    assert_eq!(f["debugged"], "Some(2)");
    let span =
        serde_json::json!({"id": "r\"1", "method": "POST", "path": "/v1/a b", "name": "request"});
    assert_eq!(v["span"], span);
    assert_eq!(v["spans"], serde_json::json!([span]));
    // The escape character is escaped, not written.
    assert!(!lines[0].contains('\u{1b}'), "{}", lines[0]);
}

#[test]
fn json_keys_that_need_escaping_are_escaped() {
    let lines = lines(LineFormat::json(), || {
        tracing::info!(
            "odd \"key\"" = 1u64,
            "back\\slash" = 2.5f64,
            plain = 3i64,
            "x"
        );
    });
    let v: serde_json::Value = serde_json::from_str(&lines[0]).expect("one JSON object");
    let f = &v["fields"];
    assert_eq!(f["odd \"key\""], 1, "{}", lines[0]);
    assert_eq!(f["back\\slash"], 2.5, "{}", lines[0]);
    assert_eq!(f["plain"], 3, "{}", lines[0]);
}

#[test]
fn json_lines_outside_spans_have_no_span_and_a_recorded_span_field_joins_the_rest() {
    let lines = lines(LineFormat::json(), || {
        tracing::info!("plain");
        let span = tracing::info_span!("outer", a = 1u64, b = tracing::field::Empty);
        span.record("b", "late");
        let _o = span.enter();
        let inner = tracing::info_span!("inner");
        let _i = inner.enter();
        tracing::info!(n = 2u64, "nested");
    });
    let plain: serde_json::Value = serde_json::from_str(&lines[0]).expect("JSON");
    assert!(
        plain.get("span").is_none() && plain.get("spans").is_none(),
        "{plain}"
    );
    let nested: serde_json::Value = serde_json::from_str(&lines[1]).expect("JSON");
    assert_eq!(nested["span"], serde_json::json!({"name": "inner"}));
    assert_eq!(
        nested["spans"],
        serde_json::json!([{"a": 1, "b": "late", "name": "outer"}, {"name": "inner"}])
    );
}

#[test]
fn text_lines_quote_what_would_not_parse_and_escape_control_characters() {
    let lines = lines(LineFormat::text(false), emit_request_lines);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        !line.contains('\u{1b}'),
        "no escape sequence gets through: {line}"
    );
    let (ts, rest) = line.split_once(' ').expect("timestamp");
    assert!(ts.ends_with('Z'), "{ts}");
    let expected = format!(
        " WARN request{{id=\"r\\\"1\" method=POST path=\"/v1/a b\"}}: {}: request \\u{{1b}}[31mfailed \
         status=503 code=no_healthy_target latency=0.25 nan=NaN negative=-3 retried=true \
         shown=\"x=y\" debugged=Some(2) message.1=\"second message\"",
        module_path!()
    );
    assert_eq!(rest, expected);
}

#[test]
fn text_lines_are_coloured_only_when_asked() {
    let plain = lines(LineFormat::text(false), || tracing::error!("x"));
    let coloured = lines(LineFormat::text(true), || tracing::error!("x"));
    assert!(plain[0].contains(" ERROR ") && !plain[0].contains('\u{1b}'));
    assert!(
        coloured[0].contains("\u{1b}[31mERROR\u{1b}[0m"),
        "{}",
        coloured[0]
    );
}

#[test]
fn an_empty_text_value_is_quoted() {
    let lines = lines(LineFormat::text(false), || tracing::info!(v = "", "m"));
    assert!(lines[0].ends_with(": m v=\"\""), "{}", lines[0]);
}

#[test]
fn second_prefixes_match_known_dates() {
    let at = |secs| {
        let mut s = String::new();
        second_prefix(&mut s, secs).expect("format");
        s
    };
    assert_eq!(at(0), "1970-01-01T00:00:00.");
    assert_eq!(at(951_782_400), "2000-02-29T00:00:00.");
    assert_eq!(at(1_796_632_014), "2026-12-07T08:26:54.");
    assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59.");
    assert_eq!(at(253_402_300_799), "9999-12-31T23:59:59.");
}

#[test]
fn consecutive_days_are_consecutive_dates() {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_len = |y: i64, m: u32| match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let mut prev = civil_from_days(0);
    assert_eq!(prev, (1970, 1, 1));
    for day in 1..200_000 {
        let next = civil_from_days(day);
        let (y, m, d) = prev;
        let expected = if d < month_len(y, m) {
            (y, m, d + 1)
        } else if m < 12 {
            (y, m + 1, 1)
        } else {
            (y + 1, 1, 1)
        };
        assert_eq!(next, expected, "day {day}");
        prev = next;
    }
}

proptest::proptest! {
    /// Whatever a client puts in a value, a JSON line parses and gives it back exactly, and a
    /// text line stays one line with no control character in it.
    #[test]
    fn any_value_stays_in_its_line(value in "\\PC*|[\\x00-\\x1f\\x7f-\\u{9f}\"=\\\\ a-z\u{e9}\u{1f600}]{0,24}") {
        let emit = || {
            let span = tracing::info_span!("request", id = value.as_str());
            let _in = span.enter();
            tracing::info!(v = value.as_str(), d = %value, "{value}");
        };
        let json = lines(LineFormat::json(), emit);
        proptest::prop_assert_eq!(json.len(), 1);
        let v: serde_json::Value = serde_json::from_str(&json[0]).expect("one JSON object");
        proptest::prop_assert_eq!(v["fields"]["message"].as_str(), Some(value.as_str()));
        proptest::prop_assert_eq!(v["fields"]["v"].as_str(), Some(value.as_str()));
        proptest::prop_assert_eq!(v["fields"]["d"].as_str(), Some(value.as_str()));
        proptest::prop_assert_eq!(v["span"]["id"].as_str(), Some(value.as_str()));
        let text = lines(LineFormat::text(false), emit);
        proptest::prop_assert_eq!(text.len(), 1);
        proptest::prop_assert!(!text[0].chars().any(char::is_control), "{}", text[0]);
    }
}

#[test]
fn a_long_line_leaves_no_large_buffer_behind() {
    let mut buf = String::with_capacity(KEEP_BYTES * 4);
    buf.push_str("long");
    reuse(&mut buf);
    assert!(buf.is_empty() && buf.capacity() <= KEEP_BYTES);
    let mut small = String::with_capacity(64);
    small.push('x');
    reuse(&mut small);
    assert!(
        small.is_empty() && small.capacity() >= 64,
        "a small buffer is kept"
    );
}

/// [`find_marked`] with both tables and their word tests against a byte-by-byte search: each
/// byte value at each place of a run longer than two words, after plain or non-ASCII bytes.
#[test]
fn the_word_search_finds_the_first_marked_byte_wherever_it_is() {
    type WordHas = fn(u64) -> bool;
    let searches: [(&[bool; 256], WordHas); 2] = [
        (&JSON_ESCAPED, json_escaped_in),
        (&TEXT_NOT_PLAIN, text_not_plain_in),
    ];
    for (table, word_has) in searches {
        let naive = |s: &[u8]| s.iter().position(|b| table[usize::from(*b)]);
        for background in [b'a', 0xc3, b'~', b'!'] {
            for len in 0..=19 {
                for at in 0..len {
                    for b in 0..=255u8 {
                        let mut s = vec![background; len];
                        s[at] = b;
                        assert_eq!(find_marked(&s, table, word_has), naive(&s), "{s:?}");
                    }
                }
            }
        }
    }
}

proptest::proptest! {
    #[test]
    fn the_word_search_agrees_with_a_byte_by_byte_one(s in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
        for (table, word_has) in [
            (&JSON_ESCAPED, json_escaped_in as fn(u64) -> bool),
            (&TEXT_NOT_PLAIN, text_not_plain_in),
        ] {
            let naive = s.iter().position(|b| table[usize::from(*b)]);
            proptest::prop_assert_eq!(find_marked(&s, table, word_has), naive);
        }
    }
}

/// A value whose `Debug` logs, formatted while the thread's buffers are in use.
struct Loud;

impl std::fmt::Debug for Loud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        tracing::info!(depth = 2, "inner line");
        f.write_str("loud value")
    }
}

#[test]
fn a_value_that_logs_while_its_line_is_built_leaves_the_line_whole() {
    for format in [LineFormat::json(), LineFormat::text(false)] {
        let lines = lines(format, || {
            let span = tracing::info_span!("request", v = ?Loud);
            let _in = span.enter();
            tracing::info!(v = ?Loud, "outer line");
        });
        // tracing drops an event made while another is being dispatched on the same thread;
        // were one let through, `with_buffer` gives it a string of its own.
        let outer: Vec<&String> = lines.iter().filter(|l| l.contains("outer line")).collect();
        assert_eq!(outer.len(), 1, "{lines:?}");
        // The event's field and the span's (in JSON the span is also in `spans`).
        let shown = if format.json { 3 } else { 2 };
        assert_eq!(outer[0].matches("loud value").count(), shown, "{lines:?}");
        assert!(outer[0].contains("loud value"), "{lines:?}");
        if format.json {
            for l in &lines {
                serde_json::from_str::<serde_json::Value>(l).expect("each line whole");
            }
        }
    }
}
