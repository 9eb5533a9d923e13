//! Which headers cross the router: hop-by-hop ones never do, and the router's own internal
//! headers (DP-rank pin, peer plane) are set by the router alone.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// Header pinning the GLOBAL DP rank.
pub static DP_RANK: HeaderName = HeaderName::from_static("x-data-parallel-rank");

/// Headers that describe one connection, not the message (plus `Host` and `Content-Length`,
/// which the router sets itself): never copied between the client's and the backend's side.
pub static HOP_BY_HOP: [HeaderName; 10] = [
    header::CONNECTION,
    header::HOST,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::CONTENT_LENGTH,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Whether `name` is in [`HOP_BY_HOP`]: one match on the name instead of ten comparisons, as
/// every header of every request and response is asked.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "host"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authorization"
            | "content-length"
            | "keep-alive"
            | "proxy-connection"
    )
}

/// Header names a message's `Connection` header nominates as hop-by-hop (RFC 9110 7.6.1), e.g.
/// `Connection: close, x-hop` makes `x-hop` one. Empty, and no allocation, in the common cases:
/// no such header, or only `keep-alive` / `close` (options, or a name dropped anyway).
pub fn nominated(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("close"))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect()
}

/// Removes a response's hop-by-hop headers and those its `Connection` header names, keeping
/// `Content-Length` (the body passes through as it is). One scan of the names first: a backend
/// rarely sends any of them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let hop = |k: &HeaderName| *k != header::CONTENT_LENGTH && is_hop_by_hop(k);
    if !headers.keys().any(hop) {
        return;
    }
    for h in nominated(headers) {
        headers.remove(h);
    }
    for h in HOP_BY_HOP.iter().filter(|h| **h != header::CONTENT_LENGTH) {
        headers.remove(h);
    }
}

/// Copies `src`'s end-to-end headers into `dst`: hop-by-hop ones, those its `Connection` header
/// names, `Host` and `Content-Length` stay behind.
pub fn copy_end_to_end(src: &HeaderMap, dst: &mut HeaderMap) {
    let connection_scoped = nominated(src);
    dst.reserve(src.len() + 4);
    for (k, v) in src {
        if !is_hop_by_hop(k) && !connection_scoped.contains(k) {
            dst.append(k, v.clone());
        }
    }
}

/// A `Content-Length` value for a body of `len` bytes: `client`'s own when it says the same
/// (a clone shares its bytes), else one allocation of exactly the digits.
pub fn content_length(len: usize, client: Option<&http::HeaderValue>) -> http::HeaderValue {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = len;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    match client {
        Some(v) if v.as_bytes() == digits => v.clone(),
        // Decimal digits are a valid header value.
        _ => http::HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(digits))
            .unwrap_or_else(|_| http::HeaderValue::from(len)),
    }
}

/// The request id's header name (also a consistent-hash key, `crate::proxy::request`).
pub const X_REQUEST_ID_NAME: &str = "x-request-id";
/// The request id, taken from the client or made by the router, sent upstream and answered.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static(X_REQUEST_ID_NAME);

/// Marks a request one replica forwarded to another (so it is served where it lands).
pub static FORWARDED_BY: HeaderName = HeaderName::from_static("x-program-router-peer");
/// The replica a forwarded request is meant for.
pub static ADDRESSED_TO: HeaderName = HeaderName::from_static("x-program-router-peer-to");
/// The member-list revision a peer call carries.
pub static REVISION: HeaderName = HeaderName::from_static("x-program-router-peer-revision");
/// The base URL of the replica that sent a peer call.
pub static SENDER_URL: HeaderName = HeaderName::from_static("x-program-router-peer-url");

/// Whether `name` is one of the router's own headers, which no client sends to a worker.
pub fn internal(name: &HeaderName) -> bool {
    name == DP_RANK
        || name == FORWARDED_BY
        || name == ADDRESSED_TO
        || name == REVISION
        || name == SENDER_URL
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn content_length_is_the_clients_when_it_agrees() {
        for len in [0, 7, 10, 4096, usize::MAX] {
            assert_eq!(content_length(len, None), HeaderValue::from(len));
        }
        let client = HeaderValue::from_static("42");
        assert_eq!(content_length(42, Some(&client)), client);
        assert_eq!(content_length(43, Some(&client)), HeaderValue::from(43));
        // A value with leading zeros or spaces is not the same bytes: made anew.
        let odd = HeaderValue::from_static("042");
        assert_eq!(content_length(42, Some(&odd)).as_bytes(), b"42");
    }

    #[test]
    fn connection_nominates_extra_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        assert!(nominated(&h).is_empty());
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Hop"),
        );
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("close,x-other , bad name"),
        );
        assert_eq!(
            nominated(&h),
            ["x-hop", "x-other"].map(HeaderName::from_static)
        );
        let mut common = HeaderMap::new();
        common.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        assert_eq!(nominated(&common).capacity(), 0, "no allocation");
        assert!(HOP_BY_HOP.contains(&HeaderName::from_static("keep-alive")));
    }

    #[test]
    fn the_hop_by_hop_match_agrees_with_the_list() {
        for h in &HOP_BY_HOP {
            assert!(is_hop_by_hop(h), "{h}");
        }
        for h in [
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            header::DATE,
            HeaderName::from_static("x-request-id"),
            HeaderName::from_static("connections"),
            HeaderName::from_static("hos"),
        ] {
            assert!(!is_hop_by_hop(&h), "{h}");
        }
    }

    #[test]
    fn a_responses_hop_by_hop_headers_go_and_its_length_and_end_to_end_ones_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-length", "x-kept"]);
        // Nothing hop-by-hop: the map is left as it is.
        let mut plain = HeaderMap::new();
        plain.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 1);
    }
}
