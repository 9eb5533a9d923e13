//! OpenTelemetry traces of the binary, received by an in-test OTLP/gRPC collector: a request that
//! carries a W3C `traceparent` yields a server span continuing that trace, with the admission,
//! queue-wait, upstream-attempt and relay spans under it; the backend receives the upstream
//! attempt's own `traceparent`.

use super::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = req
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.0.lock().expect("spans").extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A backend that answers every request with a chat completion (usage included) and keeps each
/// request's head.
fn recording_backend() -> (String, Arc<Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let heads = Arc::new(Mutex::new(Vec::new()));
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let url = format!("http://127.0.0.1:{}", l.local_addr().expect("addr").port());
    let kept = heads.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                let Ok(n) = conn.read(&mut chunk) else {
                    break None;
                };
                if n == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < head_end + length {
                let Ok(n) = conn.read(&mut chunk) else { break };
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            kept.lock().expect("heads").push(head);
            let body = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, heads)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let v = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .clone()?
        .value?;
    Some(match v {
        Value::StringValue(s) => s,
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

#[tokio::test]
async fn a_traced_request_continues_the_clients_trace_down_to_the_backend() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a collector port");
    let otlp = listener.local_addr().expect("addr").port();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    let (backend, heads) = recording_backend();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("router.json");
    let config = json!({
        "host": "127.0.0.1", "port": 0, "prometheus_port": null,
        "workers": [{"url": backend}], "log_format": "json",
        "program_scheduling": {},
        "enable_trace": true,
        "otlp_traces_endpoint": format!("http://127.0.0.1:{otlp}"),
        "otel_sampling_ratio": 0.0,
    });
    std::fs::write(&path, config.to_string()).expect("config");
    let router = start_binary(&["--config".into(), path.display().to_string()]);
    let c = client();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let mut turn: serde_json::Value = serde_json::from_str(&chat("turn", 2)).expect("json");
    turn["vllm_xargs"] = json!({"agentic_context": {"program_id": "agent-1"}});
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let r = send(
        &c,
        "POST",
        &format!("{}{CHAT}", router.base),
        &turn.to_string(),
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Sampling ratio 0: a request without a sampled parent is not exported.
    let untraced = send(
        &c,
        "POST",
        &format!("{}{CHAT}", router.base),
        &chat("x", 1),
        &[],
    )
    .await;
    assert_eq!(untraced.status, 200);

    let names = [
        "POST /v1/chat/completions",
        "admission",
        "queue wait",
        "upstream",
        "relay",
    ];
    let complete = eventually(15.0, || async {
        let spans = collector.0.lock().expect("spans");
        names.iter().all(|n| spans.iter().any(|s| s.name == *n))
    })
    .await;
    let log = stop_binary(router.child);
    let spans = collector.0.lock().expect("spans").clone();
    assert!(
        complete,
        "spans: {:?}\nlog:\n{log}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == trace_id),
        "every exported span is in the client's trace (the unsampled request exported none)"
    );
    let root = spans
        .iter()
        .find(|s| s.name == "POST /v1/chat/completions")
        .expect("the request's server span");
    assert_eq!(
        hex(&root.parent_span_id),
        client_span,
        "continues the client's span"
    );
    assert_eq!(root.kind, 2, "SERVER");
    assert_eq!(
        attribute(root, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attribute(root, "http.route").as_deref(), Some(CHAT));
    assert_eq!(
        attribute(root, "program_router.program").as_deref(),
        Some("agent-1")
    );
    for name in ["admission", "queue wait", "upstream", "relay"] {
        let s = spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span"));
        assert_eq!(
            s.parent_span_id, root.span_id,
            "{name} is a child of the request span"
        );
    }
    let upstream = spans
        .iter()
        .find(|s| s.name == "upstream")
        .expect("upstream");
    assert_eq!(upstream.kind, 3, "CLIENT");
    assert_eq!(
        attribute(upstream, "program_router.target").as_deref(),
        Some(backend.as_str())
    );
    assert_eq!(
        attribute(upstream, "http.response.status_code").as_deref(),
        Some("200")
    );
    let relay = spans.iter().find(|s| s.name == "relay").expect("relay");
    assert_eq!(
        attribute(relay, "gen_ai.usage.output_tokens").as_deref(),
        Some("2")
    );
    let queue = spans
        .iter()
        .find(|s| s.name == "queue wait")
        .expect("queue wait");
    assert_eq!(
        attribute(queue, "program_router.stage").as_deref(),
        Some("program")
    );
    // The backend got the upstream attempt's traceparent, not the client's.
    let want = format!("traceparent: 00-{trace_id}-{}-01", hex(&upstream.span_id));
    let heads = heads.lock().expect("heads");
    assert!(
        heads.iter().any(|h| h.contains(&want)),
        "no backend request carried {want}: {heads:?}"
    );
    // The exporter's spans stay out of the log: its lines list the request's span only.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let listed: Vec<String> = lines
        .iter()
        .filter_map(|l| l["spans"].as_array())
        .flatten()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect();
    assert!(listed.iter().any(|n| n == "request"), "{log}");
    assert!(listed.iter().all(|n| n == "request"), "{listed:?}");
}
