//! Where a request's system prompt starts: the bytes that name a Program's kind for
//! `resume_order: kind_size`, so that sessions of one app share a kind however short its system
//! prompt is and whatever their first user message says.
//!
//! Chat's system prompt is the first message of `messages` when its role is `system` or
//! `developer`; reading it costs at most [`SCAN_BYTES`] bytes of the array, whatever its size.

use std::ops::Range;

/// The most bytes of a system prompt a kind is named by, and of `messages` read to find it.
pub const SCAN_BYTES: usize = 1024;

/// The leading bytes (at most [`SCAN_BYTES`]) of the first message of the chat `messages` array
/// `raw` (valid JSON, as the request's peek validated it), as a range of `raw`, when that
/// message is an object whose `role` — read within those bytes — is `system` or `developer`.
pub fn chat_system(raw: &str) -> Option<Range<usize>> {
    let b = raw.as_bytes();
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
    let limit = b.len().min(start + SCAN_BYTES);
    // A small JSON walk of the first element: nesting depth, strings (with escapes), and at
    // depth 1 which string is a key and which the value after a `:`.
    let (mut depth, mut string_at, mut escaped, mut after_colon) = (0usize, None, false, false);
    let (mut key, mut role): (Option<Range<usize>>, Option<Range<usize>>) = (None, None);
    let mut end = limit;
    for (i, &c) in b.iter().enumerate().take(limit).skip(start) {
        if let Some(s) = string_at {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                string_at = None;
                if depth == 1 {
                    let text = s + 1..i;
                    if !after_colon {
                        key = Some(text);
                    } else if key.as_ref().is_some_and(|k| &b[k.clone()] == b"role") {
                        role = Some(text);
                    }
                }
            }
            continue;
        }
        match c {
            b'"' => string_at = Some(i),
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    end = i + 1;
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
    }
    let role = &b[role?];
    (role == b"system" || role == b"developer").then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(raw: &str) -> Option<&str> {
        chat_system(raw).map(|r| &raw[r])
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
        let r = chat_system(&long).expect("system");
        assert_eq!(r, 1..1 + SCAN_BYTES);
        // Its role past the bytes read: not known, so no system prompt.
        let late = format!(r#"[{{"content":"{}","role":"system"}}]"#, "a".repeat(5000));
        assert_eq!(chat_system(&late), None);
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
            assert_eq!(chat_system(raw), None, "{raw}");
        }
    }
}
