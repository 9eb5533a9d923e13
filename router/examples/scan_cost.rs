//! What reading a response's first tool call costs the relay (`tool_ttl_min_samples`, on by
//! default), next to the usage read it does on every response anyway.
//!
//! The relay reads Program responses only: a JSON body's kept tail (the last 16 KiB) once at
//! its end, or each streamed event until one names a tool. This times the same functions on
//! vLLM-shaped responses — streamed with and without a call, whole bodies with and without one
//! — and prints nanoseconds per response: the median of 15 batches, so a stall of the machine
//! lands in one batch. No network. `cargo run --release -p program-router --example scan_cost`
//! (docs/benchmarks.md, "Router overhead").
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

use program_router::proxy::sse::{self, ErrorEvent};
use program_router::proxy::tool_call::tool_in_json;
use program_router::proxy::usage::usage_in_json_tail;

/// The relay keeps this much of a JSON body's end (`proxy::relay`'s tail).
const TAIL: usize = 16 * 1024;
const BATCHES: usize = 15;

fn chunk(delta: &str) -> Vec<u8> {
    format!(
        "data: {{\"id\":\"chatcmpl-9f2c1a\",\"object\":\"chat.completion.chunk\",\"created\":1764900000,\
         \"model\":\"Qwen/Qwen3-8B\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\
         \"finish_reason\":null}}]}}\n\n"
    )
    .into_bytes()
}

/// A streamed chat completion: `tokens` content events, then a tool call when `tool`, the
/// finish, the usage chunk and `[DONE]`.
fn stream(tokens: usize, tool: bool) -> Vec<Vec<u8>> {
    let mut events: Vec<Vec<u8>> = (0..tokens)
        .map(|i| chunk(&format!("{{\"content\":\" tok{i}\"}}")))
        .collect();
    if tool {
        events.push(chunk(
            "{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\
             \"function\":{\"name\":\"str_replace_editor\",\"arguments\":\"\"}}]}",
        ));
        for i in 0..40 {
            events.push(chunk(&format!(
                "{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"a{i}\"}}}}]}}"
            )));
        }
    }
    events.push(
        b"data: {\"id\":\"chatcmpl-9f2c1a\",\"object\":\"chat.completion.chunk\",\"choices\":[],\
          \"usage\":{\"prompt_tokens\":24000,\"total_tokens\":24512,\"completion_tokens\":512,\
          \"prompt_tokens_details\":{\"cached_tokens\":23800}}}\n\n"
            .to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// A whole chat completion body with `content_bytes` of content, calling a tool or not (vLLM
/// then writes `"function_call": null` and `"tool_calls": []`); the relay's kept tail of it.
fn body_tail(content_bytes: usize, tool: bool) -> Vec<u8> {
    let content = "x".repeat(content_bytes);
    let calls = if tool {
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"str_replace_editor\",\
         \"arguments\":\"{\\\"path\\\":\\\"/repo/a.py\\\"}\"}}]"
    } else {
        "[]"
    };
    let body = format!(
        "{{\"id\":\"chatcmpl-9f2c1a\",\"object\":\"chat.completion\",\"created\":1764900000,\
         \"model\":\"Qwen/Qwen3-8B\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\
         \"content\":\"{content}\",\"refusal\":null,\"annotations\":null,\"audio\":null,\
         \"function_call\":null,\"tool_calls\":{calls},\"reasoning_content\":null}},\
         \"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}}],\
         \"usage\":{{\"prompt_tokens\":24000,\"total_tokens\":24512,\"completion_tokens\":512,\
         \"prompt_tokens_details\":{{\"cached_tokens\":23800}}}}}}"
    );
    let b = body.into_bytes();
    b[b.len().saturating_sub(TAIL)..].to_vec()
}

/// Median nanoseconds per call of `f` over [`BATCHES`] batches of `n`.
fn time(n: usize, mut f: impl FnMut() -> usize) -> f64 {
    let mut per: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let t = Instant::now();
            let mut sink = 0;
            for _ in 0..n {
                sink += f();
            }
            black_box(sink);
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    per[BATCHES / 2]
}

fn main() {
    println!("response\tend and usage read (ns)\tfirst tool call read (ns)\tfound");
    for (label, events) in [
        ("stream, 512 tokens, no call", stream(512, false)),
        ("stream, 512 tokens, then a call", stream(512, true)),
    ] {
        // What the relay does on every event of every stream: look for its last event and
        // for the usage key.
        let usage = time(2_000, || {
            events
                .iter()
                .filter(|e| black_box(ErrorEvent::OpenAi.is_terminal(e)) || sse::names_usage(e))
                .count()
        });
        // Until an event names a tool, each is scanned for one.
        let mut found = None;
        let tool = time(2_000, || {
            found = events.iter().find_map(|e| tool_in_json(e));
            found.as_ref().map_or(0, String::len)
        });
        println!("{label}\t{usage:.0}\t{tool:.0}\t{found:?}");
    }
    for (label, tail) in [
        ("body, 1 KiB content, a call", body_tail(1024, true)),
        ("body, 1 KiB content, no call", body_tail(1024, false)),
        (
            "body, 64 KiB content, a call (16 KiB tail)",
            body_tail(64 * 1024, true),
        ),
        (
            "body, 64 KiB content, no call (16 KiB tail)",
            body_tail(64 * 1024, false),
        ),
    ] {
        let usage = time(20_000, || {
            usage_in_json_tail(&tail).map_or(0, |u| u.prompt_tokens as usize)
        });
        let mut found = None;
        let tool = time(20_000, || {
            found = tool_in_json(&tail);
            found.as_ref().map_or(0, String::len)
        });
        println!("{label}\t{usage:.0}\t{tool:.0}\t{found:?}");
    }
}
