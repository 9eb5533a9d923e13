//! The access log: one `info` line per request (target `access`), written when its response has
//! ended (the last byte sent, or the client gone), with what each step of the pipeline learnt:
//! the tenant, the Program, the backend (target id), the time held in the router's queues, the backend's
//! token counts. Steps fill a shared [`Access`] record; dropping its last handle writes the line.
//!
//! Every field is bounded: client-chosen strings (path, tenant, Program id) are cut at
//! [`MAX_FIELD`] bytes. Nothing from a request's headers or body is logged beyond those fields.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::log_context::RequestLog;

/// Longest client-chosen field value logged (longer ones are cut on a character boundary).
pub const MAX_FIELD: usize = 256;

/// How a relayed response ended, as the access log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The response ran to its end.
    Complete,
    /// The client left, or the request deadline passed.
    Abandoned,
    /// The backend failed after the response began.
    UpstreamError,
}

impl Ending {
    fn label(self) -> &'static str {
        match self {
            Ending::Complete => "complete",
            Ending::Abandoned => "abandoned",
            Ending::UpstreamError => "upstream_error",
        }
    }
}

#[derive(Default)]
struct Fields {
    status: u16,
    error: Option<&'static str>,
    tenant: Option<String>,
    program: Option<String>,
    target: Option<String>,
    queued: Duration,
    ending: Option<Ending>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
}

/// One request's access-log record; the line is written when the last handle drops.
pub struct Access {
    received: Instant,
    /// Its id, method and path, as its other log lines name it.
    request: Arc<RequestLog>,
    fields: Mutex<Fields>,
}

/// `s`, cut on a character boundary at [`MAX_FIELD`] bytes.
pub(super) fn cut(s: &str) -> String {
    if s.len() <= MAX_FIELD {
        return s.to_string();
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Whether an access line may be written now: something in the process records `info`
/// (the most verbose level any filter lets through); when not, no record is built. Not
/// `tracing::enabled!`, which with per-layer filters (the trace exporter's) leaves a filter
/// decision behind that drops the next span.
pub fn enabled() -> bool {
    tracing::level_filters::LevelFilter::current() >= tracing::Level::INFO
}

impl Access {
    pub fn new(received: Instant, request: Arc<RequestLog>) -> Arc<Self> {
        Arc::new(Access {
            received,
            request,
            fields: Mutex::new(Fields::default()),
        })
    }

    fn with(&self, f: impl FnOnce(&mut Fields)) {
        f(&mut self.fields.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The response's status, and the error code when the router answered with an error.
    pub fn answered(&self, status: u16, error: Option<&'static str>) {
        self.with(|f| {
            f.status = status;
            f.error = error;
        });
    }

    pub fn tenant(&self, tenant: &str) {
        self.with(|f| f.tenant = Some(cut(tenant)));
    }

    pub fn program(&self, program: &str) {
        self.with(|f| f.program = Some(cut(program)));
    }

    /// Adds time the request waited in one of the router's queues.
    pub fn queued(&self, waited: Duration) {
        self.with(|f| f.queued += waited);
    }

    /// The backend that served it, how its response ended and the token counts it reported.
    pub fn upstream(&self, target: &str, ending: Ending, tokens: Option<(u64, u64, u64)>) {
        self.with(|f| {
            f.target = Some(target.to_string());
            f.ending = Some(ending);
            if let Some((prompt, completion, cached)) = tokens {
                f.prompt_tokens = Some(prompt);
                f.completion_tokens = Some(completion);
                f.cached_tokens = Some(cached);
            }
        });
    }
}

/// The status written for a request whose response never began: its client left (or the drain
/// deadline cut it) while the router still held it (nginx's code for a client that closed).
const CLIENT_CLOSED: u16 = 499;

impl Drop for Access {
    fn drop(&mut self) {
        let f = self.fields.get_mut().unwrap_or_else(|p| p.into_inner());
        if f.status == 0 {
            f.status = CLIENT_CLOSED;
            f.ending = Some(Ending::Abandoned);
        }
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        tracing::info!(
            target: "access",
            request_id = self.request.id.as_str(),
            method = self.request.method.as_str(),
            path = self.request.path.as_str(),
            status = f.status,
            error = f.error,
            tenant = f.tenant.as_deref(),
            program = f.program.as_deref(),
            backend = f.target.as_deref(),
            queue_wait_ms = ms(f.queued),
            duration_ms = ms(self.received.elapsed()),
            prompt_tokens = f.prompt_tokens,
            completion_tokens = f.completion_tokens,
            cached_tokens = f.cached_tokens,
            end = f.ending.map(Ending::label),
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_chosen_fields_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_FIELD);
        let cut = cut(&long);
        assert!(cut.len() <= MAX_FIELD && cut.chars().all(|c| c == 'é'));
        assert_eq!(super::cut("short"), "short");
    }
}
