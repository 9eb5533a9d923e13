//! Where a request's system prompt starts: the bytes that name a Program's kind for
//! `resume_order: kind_size`, so that sessions of one app share a kind however short its system
//! prompt is and whatever their later messages say.
//!
//! For `messages` (chat, Anthropic Messages) and Responses `input` these are the leading bytes
//! of the first message: the system prompt when there is one, and otherwise the first user
//! message, which agents that keep their instructions in a template put there. Only that message
//! is read, its strings skipped at `memchr` speed and at most [`SCAN_BYTES`] of it, so the walk
//! costs a KiB, not the conversation.

use std::ops::Range;

/// The most bytes of a system prompt a kind is named by.
pub const SCAN_BYTES: usize = 1024;

/// The leading bytes (at most [`SCAN_BYTES`]) of the first message of the list `b` (valid
/// JSON, as the request's peek validated it), as a range of `b`; of `b` itself when it is not
/// a list (a Responses `input` string). `None` for an empty list.
pub fn first_message(b: &[u8]) -> Option<Range<usize>> {
    let open = b.iter().position(|c| !c.is_ascii_whitespace())?;
    if b[open] != b'[' {
        let end = b.iter().rposition(|c| !c.is_ascii_whitespace())? + 1;
        return Some(open..end.min(open + SCAN_BYTES));
    }
    let start = open
        + 1
        + b[open + 1..]
            .iter()
            .position(|c| !c.is_ascii_whitespace())?;
    if b[start] == b']' {
        return None;
    }
    // The element ends where its depth returns to 0: after its closing bracket or quote, or
    // (a bare number or literal) before the `,` or `]` after it. Only the window is read: an
    // element that does not end in it is cut at its end (a long string included).
    let window = &b[..b.len().min(start + SCAN_BYTES)];
    let (mut depth, mut i) = (0usize, start);
    let end = loop {
        if i >= window.len() {
            break window.len();
        }
        match window[i] {
            b'"' => {
                let Some(close) = string_end(window, i + 1) else {
                    break window.len();
                };
                i = close;
                if depth == 0 {
                    break i + 1;
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth <= 1 => break i + usize::from(depth == 1),
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => break i,
            _ => {}
        }
        i += 1;
    };
    Some(start..end)
}

/// The index of the `"` that closes the string whose text starts at `from`.
fn string_end(b: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', b.get(from..)?)?;
        if b[at] == b'"' {
            return Some(at);
        }
        from = at + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(raw: &str) -> Option<&str> {
        first_message(raw.as_bytes()).map(|r| &raw[r])
    }

    #[test]
    fn a_short_first_message_is_the_whole_element() {
        let a = r#"[{"role":"system","content":"You help."},{"role":"user","content":"hi"}]"#;
        let b = r#" [ {"role":"system","content":"You help."}, {"role":"user","content":"bye"}]"#;
        assert_eq!(first(a), Some(r#"{"role":"system","content":"You help."}"#));
        assert_eq!(first(a), first(b), "the later messages do not change it");
        let dev = r#"[{"content":"Be brief, \"always\" [}].","role":"developer"}]"#;
        assert_eq!(
            first(dev),
            Some(&dev[1..dev.len() - 1]),
            "brackets in strings"
        );
        let parts = r#"[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"a"}]"#;
        assert_eq!(
            first(parts),
            Some(r#"{"role":"user","content":[{"type":"text","text":"x"}]}"#)
        );
        assert_eq!(
            first(r#"["a \" b", "c"]"#),
            Some(r#""a \" b""#),
            "a string element"
        );
        assert_eq!(first("[12 , 3]"), Some("12 "), "a bare element");
        assert_eq!(
            first(r#" "just text" "#),
            Some(r#""just text""#),
            "not a list"
        );
    }

    #[test]
    fn a_long_first_message_is_its_first_bytes() {
        for first_key in ["role", "content"] {
            let (role, content) = (
                r#""role":"system""#,
                format!(r#""content":"{}""#, "a".repeat(5000)),
            );
            let element = if first_key == "role" {
                format!("{{{role},{content}}}")
            } else {
                format!("{{{content},{role}}}")
            };
            let raw = format!(r#"[{element},{{"role":"user","content":"x"}}]"#);
            assert_eq!(
                first_message(raw.as_bytes()),
                Some(1..1 + SCAN_BYTES),
                "{first_key}"
            );
        }
        let text = format!(r#""{}""#, "t".repeat(3000));
        assert_eq!(first_message(text.as_bytes()), Some(0..SCAN_BYTES));
        // A string that closes only past the window, an escape at its edge.
        let edge = format!(r#"[{{"content":"{}"x"}}]"#, "e".repeat(SCAN_BYTES - 13));
        assert_eq!(first_message(edge.as_bytes()), Some(1..1 + SCAN_BYTES));
    }

    #[test]
    fn nothing_to_read_no_range() {
        for raw in ["[]", " [ ] ", "", "  ", "["] {
            assert_eq!(first_message(raw.as_bytes()), None, "{raw:?}");
        }
    }
}
