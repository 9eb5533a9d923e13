//! Deterministic tokenization and the fixed chat template.
//!
//! The simulator needs a tokenizer with one property that matters for scheduling: equal text
//! prefixes produce equal token prefixes (except possibly the last token of the shorter text), so
//! that prefix caching behaves as it does behind a real tokenizer. The rules, which
//! `docs/vllm-sim.md` documents for workload authors, are:
//!
//! * A token is an optional run of whitespace followed by a run of non-whitespace characters,
//!   capped at [`MAX_TOKEN_CHARS`] characters in total; a longer run continues in the next token.
//!   Trailing whitespace at the end of a text is one token of its own.
//! * A token's id is a 32-bit FNV-1a hash of its UTF-8 bytes, so ids are stable across runs.
//! * Chat messages are rendered as `<|role|>` + content + `<|end|>\n`, followed by the generation
//!   prompt `<|assistant|>`; generated tokens are short words with a leading space, so a client
//!   that appends the assistant's reply to its history re-creates the same tokens.
//!
//! This module owns text → tokens only; it never touches KV state.

/// The longest token, in characters (whitespace included).
pub const MAX_TOKEN_CHARS: usize = 8;

/// Tokenizes `text` into stable token ids.
pub fn tokenize(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 4 + 1);
    tokenize_into(text, &mut out);
    out
}

/// Appends the tokens of `text` to `out`.
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut chars = 0;
    let mut seen_word = false;
    for (idx, ch) in text.char_indices() {
        let ws = ch.is_whitespace();
        let boundary = chars > 0 && ((seen_word && ws) || chars == MAX_TOKEN_CHARS);
        if boundary {
            out.push(fnv1a(&bytes[start..idx]));
            start = idx;
            chars = 0;
            seen_word = false;
        }
        chars += 1;
        seen_word |= !ws;
    }
    if start < bytes.len() {
        out.push(fnv1a(&bytes[start..]));
    }
}

/// Counts the tokens of `text` without allocating.
pub fn count_tokens(text: &str) -> usize {
    let mut n = 0;
    let mut chars = 0;
    let mut seen_word = false;
    for ch in text.chars() {
        let ws = ch.is_whitespace();
        if chars > 0 && ((seen_word && ws) || chars == MAX_TOKEN_CHARS) {
            n += 1;
            chars = 0;
            seen_word = false;
        }
        chars += 1;
        seen_word |= !ws;
    }
    n + usize::from(chars > 0)
}

/// One chat message as the template sees it.
#[derive(Debug, Clone, Copy)]
pub struct TemplateMessage<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// Renders chat messages through the fixed template, ending with the generation prompt.
pub fn render_chat<'a>(messages: impl IntoIterator<Item = TemplateMessage<'a>>) -> String {
    let mut s = String::new();
    for m in messages {
        push_role(&mut s, m.role);
        s.push_str(m.content);
        s.push_str("<|end|>\n");
    }
    s.push_str(GENERATION_PROMPT);
    s
}

/// The text every chat that opens with message `first` renders alike, whatever follows: the
/// message and the next one's role header (`next_role`; the generation prompt when none).
pub fn render_chat_opening(first: TemplateMessage<'_>, next_role: Option<&str>) -> String {
    let mut s = render_chat([first]);
    if let Some(role) = next_role {
        s.truncate(s.len() - GENERATION_PROMPT.len());
        push_role(&mut s, role);
    }
    s
}

fn push_role(s: &mut String, role: &str) {
    s.push_str("<|");
    s.push_str(role);
    s.push_str("|>");
}

/// What the template appends after the last message.
pub const GENERATION_PROMPT: &str = "<|assistant|>";

/// The text of the `index`-th generated token of a request whose prompt hashed to `seed`.
///
/// Always a space followed by at most six characters, so every generated token is exactly one
/// token again when a client sends it back.
pub fn output_token_text(seed: u64, index: u32) -> String {
    format!(" w{}", output_word(seed, index))
}

fn output_word(seed: u64, index: u32) -> u64 {
    splitmix(seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % 100_000
}

/// The id of the `index`-th generated token (the id of [`output_token_text`]), computed without
/// formatting the text: the engine calls this for every generated token.
pub fn output_token_id(seed: u64, index: u32) -> u32 {
    let mut v = output_word(seed, index);
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut text = [0u8; 22];
    text[..2].copy_from_slice(b" w");
    for (k, d) in digits[..n].iter().rev().enumerate() {
        text[2 + k] = *d;
    }
    fnv1a(&text[..2 + n])
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A small, well-mixed 64-bit hash step (SplitMix64 finaliser).
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_with_leading_space_are_single_tokens() {
        assert_eq!(tokenize("hello big world").len(), 3);
        assert_eq!(count_tokens("hello big world"), 3);
        assert_eq!(tokenize(""), Vec::<u32>::new());
    }

    #[test]
    fn long_runs_are_split_at_the_cap() {
        let t = "abcdefghijklmnopq"; // 17 chars -> 8 + 8 + 1
        assert_eq!(tokenize(t).len(), 3);
        assert_eq!(count_tokens(t), 3);
    }

    #[test]
    fn a_chats_opening_leads_every_chat_that_opens_alike() {
        let system = TemplateMessage {
            role: "system",
            content: " be brief",
        };
        let user = |content| TemplateMessage {
            role: "user",
            content,
        };
        let opening = render_chat_opening(system, Some("user"));
        let n = tokenize(&opening).len();
        for other in [" fix it", " run the tests"] {
            let full = tokenize(&render_chat([system, user(other)]));
            assert_eq!(full[..n], tokenize(&opening)[..], "{other}");
        }
        assert_eq!(render_chat_opening(system, None), render_chat([system]));
    }

    #[test]
    fn trailing_whitespace_is_its_own_token() {
        assert_eq!(tokenize("a b \n").len(), 3);
    }

    #[test]
    fn prefixes_are_stable() {
        let full = "The quick brown fox jumps over the lazy dog again and again";
        let toks = tokenize(full);
        for cut in 0..full.len() {
            if !full.is_char_boundary(cut) {
                continue;
            }
            let p = tokenize(&full[..cut]);
            let stable = p.len().saturating_sub(1);
            assert_eq!(&p[..stable], &toks[..stable], "cut at {cut}");
        }
    }

    #[test]
    fn count_matches_tokenize_on_unicode() {
        for s in ["héllo wörld ✓✓✓✓✓✓✓✓✓✓", "  a\t\tb\n\nc", "x"] {
            assert_eq!(count_tokens(s), tokenize(s).len(), "{s:?}");
        }
    }

    #[test]
    fn output_token_id_is_the_id_of_its_text() {
        for seed in [0, 1, 42, u64::MAX] {
            for index in (0..2000).chain([u32::MAX]) {
                let text = output_token_text(seed, index);
                assert_eq!(
                    tokenize(&text),
                    vec![output_token_id(seed, index)],
                    "{text:?}"
                );
            }
        }
    }

    #[test]
    fn echoed_assistant_reply_reproduces_generated_tokens() {
        let user = [TemplateMessage {
            role: "user",
            content: "do the thing",
        }];
        let prompt = render_chat(user);
        let seed = 42;
        let reply: String = (0..5).map(|i| output_token_text(seed, i)).collect();
        let mut served = tokenize(&prompt);
        served.extend((0..5).map(|i| output_token_id(seed, i)));
        let next = render_chat([
            user[0],
            TemplateMessage {
                role: "assistant",
                content: &reply,
            },
            TemplateMessage {
                role: "user",
                content: "next",
            },
        ]);
        let next_toks = tokenize(&next);
        // Everything but the last generated token (which merges with `<|end|>`) is reproduced.
        let same = served.len() - 1;
        assert_eq!(&next_toks[..same], &served[..same]);
    }
}
