//! Where a request's system prompt starts: the bytes that name a Program's kind for
//! `resume_order: kind_size`, so that sessions of one app share a kind however short its system
//! prompt is and whatever their first user message says.
//!
//! Chat's system prompt is the first message of `messages` when its role is `system` or
//! `developer`. Only that message is read, its strings skipped at `memchr` speed, so a client
//! that writes `content` before `role` costs a scan of its system prompt, not of the whole
//! conversation.

use std::ops::Range;

/// The most bytes of a system prompt a kind is named by.
pub const SCAN_BYTES: usize = 1024;

/// The leading bytes (at most [`SCAN_BYTES`]) of the first message of the chat `messages` array
/// `b` (valid JSON, as the request's peek validated it), as a range of `b`, when that
/// message is an object whose `role` is `system` or `developer`.
pub fn chat_system(b: &[u8]) -> Option<Range<usize>> {
    let open = b.iter().position(|c| !c.is_ascii_whitespace())?;
    if b[open] != b'[' {
        return None;
    }
    let start = open
        + 1
        + b[open + 1..]
            .iter()
            .position(|c| !c.is_ascii_whitespace())?;
    if b[start] != b'{' {
        return None;
    }
    // A small walk of the first element: nesting depth, strings, and at depth 1 which string
    // is a key and which the value after a `:`. It stops at the element's end, or once the role
    // is known and either is not a system role or `SCAN_BYTES` of the element are behind.
    let (mut depth, mut after_colon, mut i) = (0usize, false, start);
    let (mut key, mut role): (Option<Range<usize>>, Option<Range<usize>>) = (None, None);
    let mut end = None;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let close = string_end(b, i + 1)?;
                if depth == 1 {
                    let text = i + 1..close;
                    if !after_colon {
                        key = Some(text);
                    } else if key.as_ref().is_some_and(|k| &b[k.clone()] == b"role") {
                        role = Some(text);
                    }
                }
                i = close;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    end = Some(i + 1);
                    break;
                }
            }
            b':' if depth == 1 => after_colon = true,
            b',' if depth == 1 => {
                after_colon = false;
                key = None;
            }
            _ => {}
        }
        if role
            .as_ref()
            .is_some_and(|r| i >= start + SCAN_BYTES || !is_system(&b[r.clone()]))
        {
            break;
        }
        i += 1;
    }
    let end = end.unwrap_or(b.len()).min(start + SCAN_BYTES);
    is_system(&b[role?]).then_some(start..end)
}

fn is_system(role: &[u8]) -> bool {
    role == b"system" || role == b"developer"
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

    fn system(raw: &str) -> Option<&str> {
        chat_system(raw.as_bytes()).map(|r| &raw[r])
    }

    #[test]
    fn a_short_system_message_is_the_whole_first_element() {
        let a = r#"[{"role":"system","content":"You help."},{"role":"user","content":"hi"}]"#;
        let b = r#" [ {"role":"system","content":"You help."}, {"role":"user","content":"bye"}]"#;
        assert_eq!(
            system(a),
            Some(r#"{"role":"system","content":"You help."}"#)
        );
        assert_eq!(system(a), system(b), "the user's messages do not change it");
        let dev = r#"[{"content":"Be brief, \"always\".","role":"developer"}]"#;
        assert_eq!(
            system(dev),
            Some(&dev[1..dev.len() - 1]),
            "role after content"
        );
        let parts = r#"[{"role":"system","content":[{"type":"text","text":"x","role":"user"}]}]"#;
        assert_eq!(
            system(parts),
            Some(&parts[1..parts.len() - 1]),
            "a nested role is not the message's"
        );
    }

    #[test]
    fn a_long_system_message_is_its_first_bytes() {
        let long = format!(
            r#"[{{"role":"system","content":"{}"}},{{"role":"user","content":"x"}}]"#,
            "a".repeat(5000)
        );
        let r = chat_system(long.as_bytes()).expect("system");
        assert_eq!(r, 1..1 + SCAN_BYTES);
        // Its role after a long content: found all the same.
        let late = format!(
            r#"[{{"content":"{}\"","role":"system"}},{{"role":"user"}}]"#,
            "a".repeat(5000)
        );
        assert_eq!(chat_system(late.as_bytes()), Some(1..1 + SCAN_BYTES));
        let user = format!(r#"[{{"content":"{}","role":"user"}}]"#, "a".repeat(5000));
        assert_eq!(chat_system(user.as_bytes()), None);
    }

    #[test]
    fn no_system_message_no_range() {
        for raw in [
            r#"[{"role":"user","content":"You help."}]"#,
            r#"[{"role":"assistant","content":"system"}]"#,
            r#"[{"content":"system"}]"#,
            r#"[{"role":"sys\"tem"}]"#,
            "[]",
            r#"["system"]"#,
            r#"{"role":"system"}"#,
            "",
            "[",
        ] {
            assert_eq!(chat_system(raw.as_bytes()), None, "{raw}");
        }
    }
}
