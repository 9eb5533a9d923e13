//! OpenTelemetry traces (vllm-router's `--enable-trace`): request spans exported over OTLP/gRPC,
//! continuing a client's W3C `traceparent` and passing the upstream attempt's own on to vLLM.
//!
//! Spans are `tracing` spans with target [`TARGET`]; only the OpenTelemetry layer sees them (the
//! log's filter does not), and the request path makes them only while tracing is on, so a
//! router without it pays nothing. Export is batched on a thread of the SDK: at most
//! [`MAX_QUEUED_SPANS`] finished spans wait for the collector; more are dropped, so a slow or
//! absent collector costs spans, never memory or requests.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span that becomes an OpenTelemetry span.
pub const TARGET: &str = "program_router::trace";
/// Finished spans waiting for export at most.
pub const MAX_QUEUED_SPANS: usize = 8192;

static ON: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces (the request path makes spans only then).
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Where and how much to trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The OTLP/gRPC collector, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    /// Share of traces started here that are kept (a client's sampled `traceparent` is always
    /// followed).
    pub sampling_ratio: f64,
}

/// The exporter of a process that traces; [`Exporter::shutdown`] sends what is still queued.
pub struct Exporter(SdkTracerProvider);

impl Exporter {
    pub fn shutdown(self) {
        let _ = self.0.shutdown();
    }
}

/// The OpenTelemetry layer for `settings` (only spans of [`TARGET`] reach it), and its exporter.
/// Must run inside a tokio runtime (the gRPC client's).
pub(super) fn layer<S>(
    settings: &Settings,
) -> Result<(impl tracing_subscriber::Layer<S>, Exporter), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| format!("otlp_traces_endpoint {}: {e}", settings.endpoint))?;
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUED_SPANS)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batch)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sampling_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("program-router")
                .build(),
        )
        .build();
    let tracer = provider.tracer("program-router");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_threads(false)
        .with_location(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == TARGET
        }));
    ON.store(true, Ordering::Relaxed);
    Ok((layer, Exporter(provider)))
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// Makes `span` continue the trace of the client's `traceparent` (and `tracestate`), if any.
pub fn continue_from(span: &tracing::Span, headers: &http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(cx);
}

/// Writes `span`'s `traceparent` (and `tracestate`) into `headers`, replacing the client's, so
/// the backend's spans are children of this one.
pub fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeadersMut(headers));
}

/// The span of one request (a server span), continuing the client's trace; none when off.
pub fn request(
    method: &http::Method,
    route: &str,
    path: &str,
    headers: &http::HeaderMap,
) -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    // A client-chosen path is cut as the access log cuts it.
    let mut end = path.len().min(super::access::MAX_FIELD);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let path = &path[..end];
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = route,
        url.path = path,
        http.response.status_code = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        program_router.request_id = tracing::field::Empty,
        program_router.tenant = tracing::field::Empty,
        program_router.program = tracing::field::Empty,
        program_router.error = tracing::field::Empty,
    );
    continue_from(&span, headers);
    span
}

/// Admission: the client's key, a place under the concurrency cap, the body.
pub fn admission() -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    tracing::info_span!(target: TARGET, "admission")
}

/// A wait in one of the router's queues (`stage`: concurrency, program, fair).
pub fn queue_wait(stage: &'static str) -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    tracing::info_span!(target: TARGET, "queue wait", program_router.stage = stage)
}

/// One attempt at a backend (a client span), until its response headers arrive.
pub fn attempt(target: &str, attempt: u32) -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "upstream",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        program_router.target = target,
        program_router.attempt = attempt,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// Relaying a backend's response to the client, until it ended.
pub fn relay() -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "relay",
        program_router.end = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
    )
}
