//! Where stored Responses live: a follow-up to a Responses API response must reach the vLLM
//! server that stored it.
//!
//! vLLM keeps stored responses (`VLLM_ENABLE_RESPONSES_API_STORE`) in the API server's memory, so
//! `previous_response_id`, `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` fail
//! with 404 anywhere else. The router learns each response's id as it relays it (the first
//! field of the JSON body, or the `response.created` event of a stream) and remembers the base
//! URL that answered — any DP rank behind that URL shares its API server and so its store. The
//! memory is bounded (oldest forgotten first); an id it does not know (another replica made it,
//! the router restarted) is asked of the other replicas when there are `peers`
//! ([`crate::peers::response_home`]), else takes the normal route, where vLLM answers for itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::workers::TargetState;

/// How many response ids are remembered (about 100 bytes each).
const CAPACITY: usize = 100_000;

/// How much of a JSON body's start is kept to find its `id`.
pub const HEAD: usize = 512;

/// Response id → the base URL of the server that stored it.
#[derive(Default)]
pub struct ResponseHomes {
    inner: Mutex<Homes>,
}

#[derive(Default)]
struct Homes {
    by_id: HashMap<Box<str>, Arc<str>>,
    order: VecDeque<Box<str>>,
}

impl ResponseHomes {
    pub fn insert(&self, id: &str, url: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.by_id.insert(id.into(), url.into()).is_none() {
            g.order.push_back(id.into());
        }
        while g.order.len() > CAPACITY {
            if let Some(old) = g.order.pop_front() {
                g.by_id.remove(&old);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<str>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.by_id.get(id).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The target to send a request about stored response `id` to: the least busy available
    /// rank behind the URL that stored it, when the router knows that URL and it is still
    /// configured.
    pub fn home(&self, id: &str, targets: &[Arc<TargetState>]) -> Option<usize> {
        pick(&self.get(id)?, targets)
    }
}

/// The least busy available rank behind base URL `url`.
pub fn pick(url: &str, targets: &[Arc<TargetState>]) -> Option<usize> {
    let now = Instant::now();
    targets
        .iter()
        .enumerate()
        .filter(|(_, t)| *t.spec.url == *url && t.available(now))
        .min_by_key(|(_, t)| t.in_flight())
        .map(|(i, _)| i)
}

pub use crate::net::plain_id;

/// The stored response a path names: `/v1/responses/{id}` and its sub-resources
/// (`/cancel`, `/input_items`).
pub fn id_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The `id` of a JSON response object from the start of its body (vLLM writes it first).
pub fn id_in_json_head(head: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(head, b"\"id\"")?;
    let rest = &head[at + 4..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let mut it = serde_json::Deserializer::from_slice(&rest[colon + 1..]).into_iter::<String>();
    it.next()?.ok().filter(|id| !id.is_empty())
}

/// The response id in a Responses stream event (`response.created` and later ones carry the
/// response object).
pub fn id_in_event(event: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event {
        response: Inner,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        id: String,
    }
    memchr::memmem::find(event, b"\"response\"")?;
    serde_json::from_str::<Event>(super::sse::sse_data(event)?)
        .ok()
        .map(|e| e.response.id)
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_paths_bodies_and_events() {
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/"), None);
        assert_eq!(id_in_path("/v1/responses"), None);
        assert_eq!(
            id_in_json_head(br#"{"id": "resp_abc","object":"response","output":[{"id":"x"#),
            Some("resp_abc".into()),
            "a head cut mid-body is enough"
        );
        assert_eq!(id_in_json_head(br#"{"object":"response"}"#), None);
        let created = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"status\":\"in_progress\"}}\n\n";
        assert_eq!(id_in_event(created), Some("resp_9".into()));
        assert_eq!(
            id_in_event(b"event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n"),
            None
        );
    }

    #[test]
    fn the_memory_is_bounded_oldest_first() {
        let homes = ResponseHomes::default();
        for i in 0..CAPACITY + 10 {
            homes.insert(&format!("resp_{i}"), "http://a:8000");
        }
        assert_eq!(homes.len(), CAPACITY);
        assert!(homes.get("resp_0").is_none());
        assert!(homes.get(&format!("resp_{}", CAPACITY + 9)).is_some());
        homes.insert("resp_x", "http://b:8000");
        homes.insert("resp_x", "http://c:8000");
        assert_eq!(homes.get("resp_x").as_deref(), Some("http://c:8000"));
        assert_eq!(homes.len(), CAPACITY, "a re-insert takes no second place");
    }
}
