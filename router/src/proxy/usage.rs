//! Token usage as backends report it, and reading it from the end of a JSON response body.
//!
//! Owns [`TokenUsage`] and [`usage_in_json_tail`]. Every non-streamed response passes through the
//! tail read, so the usage object in the shape engines write (unsigned integer counts, `null`,
//! flat `*_details` objects, plain ASCII keys) is read by a small scanner; anything else it is
//! unsure of goes to serde, whose reading is the reference: the scanner only answers where serde
//! would give the same answer (the `usage` fuzz target and the tests below check that).

use serde::Deserialize;

/// Token usage as the backend reported it, in OpenAI's names or in the names of the Anthropic
/// Messages and Responses APIs (`input_tokens`, `output_tokens`, `input_tokens_details`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct TokenUsage {
    #[serde(default, alias = "input_tokens")]
    pub prompt_tokens: u64,
    #[serde(default, alias = "output_tokens")]
    pub completion_tokens: u64,
    #[serde(default, alias = "input_tokens_details")]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl TokenUsage {
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
    }
}

/// The last `"usage": {...}` object in the tail of a JSON body.
pub fn usage_in_json_tail(tail: &[u8]) -> Option<TokenUsage> {
    let rest = after_last_usage_key(tail)?;
    match scan(rest) {
        Scan::Read(u) => u,
        Scan::Unsure => usage_by_serde(rest),
    }
}

/// The bytes after the colon that follows the last `"usage"` in `tail`. Found from the end by
/// the key's `u`, which no key of a usage object contains in OpenAI's names.
fn after_last_usage_key(tail: &[u8]) -> Option<&[u8]> {
    let at = memchr::memrchr_iter(b'u', tail)
        .find(|&i| i > 0 && tail[i - 1] == b'"' && tail[i..].starts_with(b"usage\""))?;
    let rest = &tail[at + 6..];
    let colon = memchr::memchr(b':', rest)?;
    Some(&rest[colon + 1..])
}

/// serde's reading of the value at the start of `rest`.
fn usage_by_serde(rest: &[u8]) -> Option<TokenUsage> {
    // Validated once, so the parser does not check each key again; a cut character at the very
    // end of the tail (a body split mid-character) is not part of the object.
    let text = match std::str::from_utf8(rest) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).ok()?,
    };
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<TokenUsage>();
    it.next()?.ok()
}

/// The scanner's answer: what serde would read, or that it cannot tell.
#[derive(Debug, PartialEq)]
enum Scan {
    Read(Option<TokenUsage>),
    Unsure,
}

/// A value the scanner reads: a count, `null`, or something it skipped.
enum Value {
    Count(u64),
    Null,
    Other,
}

/// Printable ASCII without escapes: read by serde as the same bytes.
fn plain(text: &[u8]) -> bool {
    text.iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'\\')
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.i) == Some(&b)).then(|| self.i += 1)
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    /// A string's raw bytes, up to its closing quote (escapes are not decoded).
    fn raw_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let rest = &self.s[self.i..];
        let text = &rest[..memchr::memchr(b'"', rest)?];
        self.i += text.len() + 1;
        Some(text)
    }

    /// A string of printable ASCII without escapes (anything else: unsure).
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.raw_string().filter(|t| plain(t))
    }

    /// An unsigned integer as serde reads it into a `u64`: no sign, fraction, exponent, leading
    /// zero, or overflow (anything else: unsure).
    fn count(&mut self) -> Option<u64> {
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(&d @ b'0'..=b'9') = self.s.get(self.i) {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let digits = &self.s[start..self.i];
        let ends = !matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E' | b'-' | b'+'));
        (!digits.is_empty() && (digits.len() == 1 || digits[0] != b'0') && ends).then_some(n)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.s[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// A count, `null`, `true`, `false`, or a plain string; with `nested`, also a flat object of
    /// those (the `*_details` objects).
    fn value(&mut self, nested: bool) -> Option<Value> {
        match self.peek()? {
            b'0'..=b'9' => self.count().map(Value::Count),
            b'n' => self.literal(b"null").map(|()| Value::Null),
            b't' => self.literal(b"true").map(|()| Value::Other),
            b'f' => self.literal(b"false").map(|()| Value::Other),
            b'"' => self.plain_string().map(|_| Value::Other),
            b'{' if nested => {
                self.object(|c, key| plain(key).then_some(()).and(c.value(false)).map(|_| ()))?;
                Some(Value::Other)
            }
            _ => None,
        }
    }

    /// An object whose members `member` reads, given the cursor at the value and the key.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.ws();
            // Raw: a member's name matched exactly is plain; any other is checked by `member`.
            let key = self.raw_string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// Reads the usage value at the start of `rest` where it is certain of serde's answer.
fn scan(rest: &[u8]) -> Scan {
    let mut c = Cursor { s: rest, i: 0 };
    if c.peek() == Some(b'n') {
        // `"usage": null` is no usage (serde's error on it: a struct expected).
        return match c.literal(b"null") {
            Some(()) => Scan::Read(None),
            None => Scan::Unsure,
        };
    }
    let (mut prompt, mut completion) = (None, None);
    let mut details: Option<Option<PromptDetails>> = None;
    let read = c.object(|c, key| {
        // A field named twice (or by both of its names) is serde's error: left to serde.
        let set = |slot: &mut Option<u64>, c: &mut Cursor<'_>| match (c.value(false)?, *slot) {
            (Value::Count(n), None) => {
                *slot = Some(n);
                Some(())
            }
            _ => None,
        };
        match key {
            b"prompt_tokens" | b"input_tokens" => set(&mut prompt, c),
            b"completion_tokens" | b"output_tokens" => set(&mut completion, c),
            b"prompt_tokens_details" | b"input_tokens_details" if details.is_none() => {
                if c.peek()? == b'n' {
                    c.literal(b"null")?;
                    details = Some(None);
                    return Some(());
                }
                let mut cached: Option<Option<u64>> = None;
                c.object(|c, key| match (key, c.value(false)?) {
                    (b"cached_tokens", _) if cached.is_some() => None,
                    (b"cached_tokens", Value::Count(n)) => {
                        cached = Some(Some(n));
                        Some(())
                    }
                    (b"cached_tokens", Value::Null) => {
                        cached = Some(None);
                        Some(())
                    }
                    (b"cached_tokens", Value::Other) => None,
                    _ => plain(key).then_some(()),
                })?;
                details = Some(Some(PromptDetails {
                    cached_tokens: cached.flatten(),
                }));
                Some(())
            }
            b"prompt_tokens_details" | b"input_tokens_details" => None,
            _ if plain(key) => c.value(true).map(|_| ()),
            _ => None,
        }
    });
    match read {
        Some(()) => Scan::Read(Some(TokenUsage {
            prompt_tokens: prompt.unwrap_or(0),
            completion_tokens: completion.unwrap_or(0),
            prompt_tokens_details: details.flatten(),
        })),
        None => Scan::Unsure,
    }
}

/// Whether the scanner and serde agree on `tail` (the scanner answering, or leaving it to
/// serde): the fuzz target's and the tests' check.
pub(crate) fn scanner_agrees(tail: &[u8]) -> bool {
    let Some(rest) = after_last_usage_key(tail) else {
        return true;
    };
    match scan(rest) {
        Scan::Read(u) => u == usage_by_serde(rest),
        Scan::Unsure => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scanned(object: &str) -> Scan {
        scan(object.as_bytes())
    }

    #[test]
    fn the_engines_shapes_are_read_without_serde() {
        for (object, want) in [
            (
                r#"{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}}"#,
                (5, 1, 3),
            ),
            (
                r#" { "prompt_tokens" : 9 , "completion_tokens" : 2 , "prompt_tokens_details" : null } }"#,
                (9, 2, 0),
            ),
            (
                r#"{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":0,"service_tier":"standard"}}"#,
                (12, 3, 0),
            ),
            (
                r#"{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":11}}"#,
                (9, 2, 4),
            ),
            (r#"{}"#, (0, 0, 0)),
        ] {
            let Scan::Read(Some(u)) = scanned(object) else {
                panic!("not read: {object}");
            };
            assert_eq!(
                (u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
                want,
                "{object}"
            );
            assert_eq!(Some(u), usage_by_serde(object.as_bytes()), "{object}");
        }
        assert_eq!(scanned("null}"), Scan::Read(None));
    }

    #[test]
    fn what_the_scanner_cannot_vouch_for_goes_to_serde() {
        for object in [
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":1.0}"#,
            r#"{"prompt_tokens":1e3}"#,
            r#"{"prompt_tokens":01}"#,
            r#"{"prompt_tokens":18446744073709551616}"#,
            r#"{"prompt_tokens":null}"#,
            r#"{"prompt_tokens":1,"input_tokens":2}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":1}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":"1"}}"#,
            r#"{"prompt_\u0074okens":4}"#,
            r#"{"note":"caf\u00e9","prompt_tokens":4}"#,
            r#"{"note":"café","prompt_tokens":4}"#,
            r#"{"list":[1,2],"prompt_tokens":4}"#,
            r#"{"prompt_tokens":4"#,
            r#"[1]"#,
        ] {
            assert_eq!(scanned(object), Scan::Unsure, "{object}");
        }
        // And through the whole path, serde's answer stands.
        let body = br#"{"usage":{"prompt_\u0074okens":4,"completion_tokens":1}}"#;
        assert_eq!(usage_in_json_tail(body).map(|u| u.prompt_tokens), Some(4));
        let body = br#"{"usage":{"prompt_tokens":-1,"completion_tokens":1}}"#;
        assert_eq!(usage_in_json_tail(body), None);
    }

    #[test]
    fn the_last_usage_key_is_found_from_the_end() {
        let body = br#"{"choices":[{"message":{"content":"\"usage\": {\"prompt_tokens\":1}"}}],"usage":{"prompt_tokens":7}}"#;
        assert_eq!(usage_in_json_tail(body).map(|u| u.prompt_tokens), Some(7));
        assert_eq!(usage_in_json_tail(b"{\"output\":\"busy queue\"}"), None);
        assert_eq!(after_last_usage_key(b"usage\":1"), None, "no opening quote");
    }

    /// Usage-like objects assembled from the pieces engines write and the ones that trip
    /// parsers: the scanner either answers as serde does or leaves it to serde.
    fn object() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "prompt_tokens",
            "input_tokens",
            "completion_tokens",
            "output_tokens",
            "total_tokens",
            "prompt_tokens_details",
            "input_tokens_details",
            "cached_tokens",
            "prompt_\\u0074okens",
            "x",
        ]);
        let value = prop::sample::select(vec![
            "0",
            "7",
            "18446744073709551615",
            "18446744073709551616",
            "-3",
            "1.5",
            "2e2",
            "007",
            "null",
            "true",
            "\"s\"",
            "\"\\n\"",
            "[]",
            "{}",
            "{\"cached_tokens\":3}",
            "{\"cached_tokens\":null}",
            "{\"cached_tokens\":1,\"cached_tokens\":1}",
            "{\"cached_tokens\":{}}",
            "{\"a\":{\"b\":1}}",
        ]);
        let ws = prop::sample::select(vec!["", " ", "\n\t"]);
        prop::collection::vec((key, value, ws), 0..6).prop_map(|members| {
            let body: Vec<String> = members
                .into_iter()
                .map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}{w}"))
                .collect();
            format!("{{{}}}", body.join(","))
        })
    }

    proptest! {
        #[test]
        fn the_scanner_never_disagrees_with_serde(object in object(), cut in 0usize..4) {
            let body = format!("{{\"id\":\"x\",\"usage\":{object}}}");
            let body = &body.as_bytes()[..body.len() - cut.min(body.len())];
            prop_assert!(scanner_agrees(body), "{}", String::from_utf8_lossy(body));
        }

        #[test]
        fn arbitrary_tails_never_disagree(tail in prop::collection::vec(any::<u8>(), 0..64)) {
            let mut body = b"{\"usage\":".to_vec();
            body.extend_from_slice(&tail);
            prop_assert!(scanner_agrees(&body));
        }
    }
}
