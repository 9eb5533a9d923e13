//! Which tool a response called: the name of its first tool call, for the tool-aware TTL
//! (`tool_ttl_min_samples`).
//!
//! Owns [`tool_in_json`], [`tool_call_in_json`] and [`ending_in_json_tail`]. The first reads
//! the shapes the three APIs write — a chat completion's `"tool_calls": [{…, "function":
//! {"name": …}}]`, a Messages API `{"type": "tool_use", …, "name": …}` block and a Responses API
//! `{"type": "function_call", …, "name": …}` item — in a JSON body's kept tail or in one
//! streamed event, without parsing the document: the first `"name"` key after the first marker
//! that is not a key of `null` or `[]` (vLLM writes `"function_call": null, "tool_calls": []`
//! when nothing was called), its string unescaped. A name it cannot read (absent, cut off, not a
//! plain string, longer than [`MAX_NAME_BYTES`]) is no name; the second tells such a call from
//! no call at all (the relay counts a stream's unnamed call as a call of an unknown tool). The
//! scheduler keeps a shorter prefix of a name. The third reads why a JSON body ended
//! (`finish_reason`, a Messages `stop_reason`) from its last bytes, for a body too long for its
//! start to be kept.

use std::sync::LazyLock;

use memchr::memmem::{Finder, FinderRev};

/// The longest tool name read, in bytes once unescaped (it bounds the scan, too).
pub const MAX_NAME_BYTES: usize = 256;

/// The markers that open a tool call in each API's output.
const MARKERS: [&[u8]; 3] = [b"\"tool_calls\"", b"\"tool_use\"", b"\"function_call\""];

/// The markers' and the name key's searchers, built once: `memmem::find` builds one per call,
/// which costs more than scanning a streamed event.
static FINDERS: LazyLock<([Finder<'static>; 3], Finder<'static>)> =
    LazyLock::new(|| (MARKERS.map(Finder::new), Finder::new(b"\"name\"")));

/// The name of the first tool call in `json` (a body's tail, or one SSE event).
pub fn tool_in_json(json: &[u8]) -> Option<String> {
    match tool_call_in_json(json) {
        Call::Named(name) => Some(name),
        Call::Unnamed | Call::None => None,
    }
}

/// What one piece of JSON says of a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Its first tool call names this tool.
    Named(String),
    /// A tool call whose name is not there or cannot be read (cut off, not a string, too long):
    /// in a stream, the event after the one that named it, or the call of a name too long.
    Unnamed,
    /// No tool call.
    None,
}

/// The first tool call in `json`, as [`tool_in_json`] reads it, telling a call it could not name
/// from no call.
pub fn tool_call_in_json(json: &[u8]) -> Call {
    let (markers, name) = &*FINDERS;
    let find = |k: usize, from: usize| markers[k].find(&json[from..]).map(|i| from + i);
    // Each marker's next place at or after `from`, searched again only once passed: one pass
    // over the input per marker, however many `null`s and `[]`s it skips.
    let mut next = [find(0, 0), find(1, 0), find(2, 0)];
    let mut from = 0;
    loop {
        for (k, at) in next.iter_mut().enumerate() {
            if at.is_some_and(|at| at < from) {
                *at = find(k, from);
            }
        }
        let Some((k, at)) = (0..MARKERS.len())
            .filter_map(|k| next[k].map(|at| (k, at)))
            .min_by_key(|(_, at)| *at)
        else {
            return Call::None;
        };
        let rest = &json[at + MARKERS[k].len()..];
        if !no_call(rest) {
            let named = name.find(rest).and_then(|key| {
                let after = skip_ws(&rest[key + 6..]);
                string_value(skip_ws(after.strip_prefix(b":")?))
            });
            return named.map_or(Call::Unnamed, Call::Named);
        }
        // `"tool_calls": []`, `"function_call": null` (vLLM writes both when no tool is
        // called): look further.
        from = at + MARKERS[k].len();
    }
}

/// Why a response ended, as its body's tail says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The model answered (stopped, or ran out of tokens) without calling a tool.
    Answer,
    /// The model called a tool (its name may lie before the tail).
    Tool,
}

/// Why the response whose JSON body ends with `tail` ended: the last `"finish_reason"` (chat and
/// text completions) or, without one, the last `"stop_reason"` (the Messages API; vLLM's chat
/// completions write that key too, for the stop string, after `finish_reason`). The last one,
/// as both follow the content; a key inside a JSON string is escaped and never matches. `None`
/// for any other value (`null`, an abort, a reason this does not know) or none found.
pub fn ending_in_json_tail(tail: &[u8]) -> Option<Ending> {
    let (finish, stop) = &*ENDINGS;
    let (key, value) = match finish.rfind(tail) {
        Some(at) => (at + FINISH_KEY.len(), true),
        None => (stop.rfind(tail)? + STOP_KEY.len(), false),
    };
    let v = skip_ws(skip_ws(&tail[key..]).strip_prefix(b":")?);
    let reason = string_value(v)?;
    match (value, reason.as_str()) {
        (true, "stop" | "length" | "content_filter") => Some(Ending::Answer),
        (true, "tool_calls" | "function_call") => Some(Ending::Tool),
        (false, "end_turn" | "max_tokens" | "stop_sequence" | "refusal") => Some(Ending::Answer),
        (false, "tool_use") => Some(Ending::Tool),
        _ => None,
    }
}

const FINISH_KEY: &[u8] = b"\"finish_reason\"";
const STOP_KEY: &[u8] = b"\"stop_reason\"";

static ENDINGS: LazyLock<(FinderRev<'static>, FinderRev<'static>)> =
    LazyLock::new(|| (FinderRev::new(FINISH_KEY), FinderRev::new(STOP_KEY)));

/// The marker is a key whose value is `null` or `[]`.
fn no_call(rest: &[u8]) -> bool {
    let Some(v) = skip_ws(rest).strip_prefix(b":") else {
        return false;
    };
    let v = skip_ws(v);
    v.starts_with(b"null")
        || v.strip_prefix(b"[")
            .is_some_and(|r| skip_ws(r).starts_with(b"]"))
}

fn skip_ws(b: &[u8]) -> &[u8] {
    let n = b
        .iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &b[n..]
}

/// The JSON string at the start of `b`, unescaped; `None` if it is not a whole string of at
/// most [`MAX_NAME_BYTES`] bytes once unescaped.
fn string_value(b: &[u8]) -> Option<String> {
    if b.first() != Some(&b'"') {
        return None;
    }
    // An escaped name takes at most 6 bytes a byte; anything longer is beyond the cap anyway.
    let window = &b[..b.len().min(2 + 6 * MAX_NAME_BYTES)];
    let mut i = 1;
    while i < window.len() {
        match window[i] {
            b'\\' => i += 2,
            b'"' => {
                let name: String = serde_json::from_slice(&window[..=i]).ok()?;
                return (!name.is_empty() && name.len() <= MAX_NAME_BYTES).then_some(name);
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the content, the arguments and the names hold (quotes, escapes, `"name"`
        /// inside strings, any characters), the scanner names the first call's tool as serde
        /// reads it — or none when that name is empty or past the cap.
        #[test]
        fn the_first_calls_name_as_serde_reads_it(
            content in ".{0,40}",
            names in prop::collection::vec(".{0,70}", 1..3),
            args in ".{0,40}",
            pretty in any::<bool>(),
            legacy_null in any::<bool>(),
        ) {
            let calls: Vec<_> = names
                .iter()
                .map(|n| serde_json::json!({"id": "c", "type": "function",
                    "function": {"name": n, "arguments": args}}))
                .collect();
            let mut message = serde_json::json!({"role": "assistant", "content": content,
                "tool_calls": calls});
            if legacy_null {
                message["function_call"] = serde_json::Value::Null;
            }
            let body = serde_json::json!({"id": "x", "choices": [{"index": 0, "message": message}],
                "usage": {"prompt_tokens": 1}});
            let text = if pretty {
                serde_json::to_vec_pretty(&body)
            } else {
                serde_json::to_vec(&body)
            };
            let text = text.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let first = &names[0];
            let want = (!first.is_empty() && first.len() <= MAX_NAME_BYTES)
                .then(|| first.clone());
            prop_assert_eq!(tool_in_json(&text), want);
        }
    }

    #[test]
    fn each_apis_first_tool_call_is_named() {
        let chat = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok","tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"name\":\"x\"}"}},{"id":"c2","type":"function","function":{"name":"run_tests","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3}}"#;
        assert_eq!(tool_in_json(chat).as_deref(), Some("read_file"));
        let messages = br#"{"content":[{"type":"text","text":"x"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"name":"y"}}],"stop_reason":"tool_use"}"#;
        assert_eq!(tool_in_json(messages).as_deref(), Some("get_weather"));
        let responses = br#"{"output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"search","arguments":"{}"}]}"#;
        assert_eq!(tool_in_json(responses).as_deref(), Some("search"));
        // A streamed chat delta, and an escaped name.
        // vLLM writes `"function_call": null` before the calls.
        let vllm = br#"{"message":{"function_call":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"grep","arguments":"{}"}}]}}"#;
        assert_eq!(tool_in_json(vllm).as_deref(), Some("grep"));
        let delta = b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\" : \"a\\u00e9b\",\"arguments\":\"\"}}]}}]}\n\n";
        assert_eq!(tool_in_json(delta).as_deref(), Some("a\u{e9}b"));
    }

    #[test]
    fn markers_that_name_nothing_are_passed_in_any_order() {
        // Three choices (`n` = 3): the first two call nothing (their keys in both orders), the
        // third calls a tool; each marker is met again after the others were passed.
        let body = br#"{"choices":[{"message":{"function_call":null,"tool_calls":[]}},{"message":{"tool_calls":[],"function_call":null}},{"message":{"function_call":null,"tool_calls":[{"function":{"name":"run_tests"}}]}}]}"#;
        assert_eq!(tool_in_json(body).as_deref(), Some("run_tests"));
        // A Messages block after empty Responses-style keys.
        let mixed = br#"{"function_call":null,"tool_calls":[ ],"function_call":null,"content":[{"type":"tool_use","name":"edit"}]}"#;
        assert_eq!(tool_in_json(mixed).as_deref(), Some("edit"));
    }

    #[test]
    fn a_tail_says_why_its_body_ended() {
        use Ending::*;
        for (tail, want) in [
            // A chat completion's long answer, and vLLM's `stop_reason` after the finish.
            (&br#"lo","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{}}"#[..], Some(Answer)),
            (br#"ng"},"finish_reason" : "length"}]}"#, Some(Answer)),
            (br#"\"}"}}]},"finish_reason":"tool_calls","stop_reason":null}]}"#, Some(Tool)),
            // A stop string that looks like a Messages reason is not read as one.
            (br#"x"},"finish_reason":"stop","stop_reason":"tool_use"}]}"#, Some(Answer)),
            // Messages: the content's own keys (a tool input's, escaped text's) come before.
            (br#"x\"stop_reason\":\"tool_use\""}],"stop_reason":"end_turn","stop_sequence":null}"#, Some(Answer)),
            (br#"{"stop_reason":"end_turn"}}],"stop_reason":"tool_use","usage":{}}"#, Some(Tool)),
            (br#"d"}],"stop_reason":"max_tokens"}"#, Some(Answer)),
            // Unknown, absent or cut.
            (br#"x"}],"finish_reason":null}"#, None),
            (br#"x"}],"finish_reason":"abort"}"#, None),
            (br#"x"}],"stop_reason":"pause_turn"}"#, None),
            (br#"x"}],"status":"completed","usage":{}}"#, None),
            (br#"x"}],"finish_reason":"sto"#, None),
        ] {
            assert_eq!(ending_in_json_tail(tail), want, "{}", String::from_utf8_lossy(tail));
        }
    }

    #[test]
    fn no_call_no_name() {
        for body in [
            &br#"{"choices":[{"message":{"content":"hi","tool_calls":[]},"finish_reason":"stop"}]}"#[..],
            br#"{"choices":[{"message":{"content":"hi","tool_calls": null}}],"model":"m","name":"x"}"#,
            br#"{"choices":[{"message":{"content":"plain","name":"bob"}}]}"#,
            // vLLM's shape without a call: both keys present, neither names anything.
            br#"{"choices":[{"message":{"content":"x","function_call":null,"tool_calls":[]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1},"kv_transfer_params":{"name":"n"}}"#,
            // Cut before the name's value ends, or a name that is not a string.
            br#"{"tool_calls":[{"function":{"name":"read_fi"#,
            br#"{"tool_calls":[{"function":{"name":42}}]}"#,
            br#"{"tool_calls":[{"function":{"name":""}}]}"#,
        ] {
            assert_eq!(tool_in_json(body), None, "{}", String::from_utf8_lossy(body));
        }
        let long = format!(
            r#"{{"tool_calls":[{{"function":{{"name":"{}"}}}}]}}"#,
            "x".repeat(MAX_NAME_BYTES + 1)
        );
        assert_eq!(tool_in_json(long.as_bytes()), None);
        assert_eq!(tool_call_in_json(long.as_bytes()), Call::Unnamed);
    }

    #[test]
    fn a_call_without_a_readable_name_is_told_from_no_call() {
        for event in [
            // A streamed call's later deltas, and the Messages API's ending of a call.
            &br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"p\":1}"}}]}}]}"#[..],
            br#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null}}"#,
            br#"{"tool_calls":[{"function":{"name":42}}]}"#,
            br#"{"tool_calls":[{"function":{"name":"read_fi"#,
        ] {
            assert_eq!(
                tool_call_in_json(event),
                Call::Unnamed,
                "{}",
                String::from_utf8_lossy(event)
            );
        }
        for event in [
            &br#"{"choices":[{"delta":{"content":"the tool_calls key"},"finish_reason":null}]}"#[..],
            br#"{"choices":[{"message":{"content":"x","function_call":null,"tool_calls":[]}}]}"#,
            br#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
        ] {
            assert_eq!(tool_call_in_json(event), Call::None);
        }
        assert_eq!(
            tool_call_in_json(br#"{"type":"tool_use","id":"t","name":"edit"}"#),
            Call::Named("edit".into())
        );
    }
}
