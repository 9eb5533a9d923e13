//! The request a log line is written in: its id, method and path, which the line lists as its
//! `request` span (`observe::log_format`).
//!
//! Not a tracing span: a span is built in tracing's registry, its fields formatted by the log
//! layer, and entered and left through every layer on each poll of the request, for lines most
//! requests never write (its cost: docs/router.md, log lines). Here the request's future holds
//! the three values and lends them to its thread while it is polled, and a line formats them
//! only when it is written. Built only when something records `info` or finer, as the span was.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use super::access::cut;

/// What a request's log lines say about it. Client-chosen values are cut as in the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLog {
    pub id: String,
    pub method: String,
    pub path: String,
}

impl RequestLog {
    /// The request's context, when a line at `info` or finer may be written (see
    /// [`super::access::enabled`]); its access-log record shares it.
    pub fn new(id: &str, method: &str, path: &str) -> Option<Arc<Self>> {
        super::access::enabled().then(|| Arc::new(Self::cut(id, method, path)))
    }

    /// The three values, each cut at [`super::access::MAX_FIELD`] bytes.
    fn cut(id: &str, method: &str, path: &str) -> Self {
        RequestLog {
            id: cut(id),
            method: cut(method),
            path: cut(path),
        }
    }
}

thread_local! {
    /// The request being polled on this thread.
    static CURRENT: RefCell<Option<Arc<RequestLog>>> = const { RefCell::new(None) };
}

/// Runs `f` with the request being polled on this thread, if any.
pub fn with_current<R>(f: impl FnOnce(Option<&RequestLog>) -> R) -> R {
    CURRENT.with(|c| match c.try_borrow() {
        Ok(current) => f(current.as_deref()),
        Err(_) => f(None),
    })
}

/// Lends `slot` to the thread while it lives, and takes it back when dropped (a poll's end or
/// its panic).
struct Lent<'a> {
    slot: &'a mut Option<Arc<RequestLog>>,
    before: Option<Arc<RequestLog>>,
}

impl<'a> Lent<'a> {
    fn new(slot: &'a mut Option<Arc<RequestLog>>) -> Self {
        let before = CURRENT.with(|c| c.replace(slot.take()));
        Lent { slot, before }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        *self.slot = CURRENT.with(|c| c.replace(self.before.take()));
    }
}

/// `fut`, with `request` as the thread's current request while it is polled.
pub async fn in_request<F: Future>(request: Arc<RequestLog>, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut slot = Some(request);
    std::future::poll_fn(move |cx| {
        let _lent = Lent::new(&mut slot);
        fut.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::super::access::MAX_FIELD;
    use super::*;

    fn request(id: &str) -> Arc<RequestLog> {
        Arc::new(RequestLog {
            id: id.into(),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
        })
    }

    fn current_id() -> Option<String> {
        with_current(|r| r.map(|r| r.id.clone()))
    }

    #[test]
    fn client_chosen_values_are_cut_as_in_the_access_log() {
        let long = "é".repeat(MAX_FIELD);
        let r = RequestLog::cut(&long, "POST", &format!("/v1/{long}"));
        assert!(r.id.len() <= MAX_FIELD && r.id.starts_with('é'));
        assert!(r.path.len() <= MAX_FIELD && r.path.starts_with("/v1/é"));
        assert_eq!(r.method, "POST");
    }

    #[tokio::test]
    async fn a_request_is_current_only_while_it_is_polled() {
        assert_eq!(current_id(), None);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let a = tokio::spawn(in_request(request("a"), async move {
            let before = current_id();
            let _ = rx.await;
            (before, current_id())
        }));
        // While `a` waits, this task (and its thread) has no request.
        tokio::task::yield_now().await;
        assert_eq!(current_id(), None);
        let b = in_request(request("b"), async {
            let outer = current_id();
            let inner = in_request(request("c"), async { current_id() }).await;
            (outer, inner, current_id())
        })
        .await;
        assert_eq!(
            b,
            (Some("b".into()), Some("c".into()), Some("b".into())),
            "a nested request is current inside, the outer one again after"
        );
        assert_eq!(current_id(), None);
        tx.send(()).expect("a waits");
        let a = a.await.expect("a");
        assert_eq!(a, (Some("a".into()), Some("a".into())));
    }

    #[test]
    fn a_panicking_poll_gives_the_request_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(in_request(request("p"), async {
                panic!("in the request");
            }))
        }));
        assert!(caught.is_err());
        assert_eq!(
            current_id(),
            None,
            "the thread has no request left after a panic"
        );
    }
}
