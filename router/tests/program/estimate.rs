//! The token estimate's error series: each completion with usage records the admission-time
//! estimate over the engine's prompt tokens, so an operator sees when the estimate is off.

use super::*;

/// vllm-sim's tokenizer makes each " w" of the prompt one token (2 bytes), while the estimate
/// starts at 4 bytes per token and learns slowly: these requests are under-estimated, and the
/// series says so.
#[tokio::test]
async fn the_estimate_error_is_recorded_for_every_completion_with_usage() {
    let (_s, r) = setup(roomy()).await;
    let c = client();
    for turn in 0..4 {
        let body = program_body("estimated", 200 + turn * 20, json!({}));
        let reply = post(&c, &r.url(CHAT), &body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let text = get_metrics(&c, &r).await;
    let sample = |name: &str, le: Option<&str>| {
        program_router::observe::scrape::samples(&text)
            .find(|s| {
                s.name == name
                    && s.label("endpoint") == Some(CHAT)
                    && s.label("model_pool") == Some("program:all")
                    && s.label("le") == le
            })
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("{name} le={le:?} in\n{text}"))
    };
    let family = "program_router_program_token_estimate_error_ratio";
    let count = sample(&format!("{family}_count"), None);
    let observed = program_router::observe::scrape::samples(&text)
        .find(|s| {
            s.name == "vllm_router_agent_aware_token_estimate_feedback_total"
                && s.label("outcome") == Some("observed")
        })
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("feedback in\n{text}"));
    assert_eq!(count, 4.0, "one sample per completion");
    assert_eq!(count, observed, "the same completions feed both");
    assert_eq!(
        sample(&format!("{family}_bucket"), Some("0.9")),
        4.0,
        "every estimate below 0.9 of the engine's count"
    );
    let mean = sample(&format!("{family}_sum"), None) / count;
    assert!(mean > 0.3 && mean < 0.9, "mean ratio {mean}");
}
