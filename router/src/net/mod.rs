//! The wire, shared by every layer: TCP settings, closing a listener (`listen`), the body type of
//! every response, which headers cross the router, the pooled client of health checks and
//! scrapes, and the timer that keeps request timers from waking an I/O runtime (`timer_floor`).
//!
//! Owns TCP keep-alive here: a peer that vanished without closing (its node died, a NAT forgot
//! the flow) otherwise holds a connection until a timeout far above it: a client's generation
//! keeps running on vLLM, and a request to a dead backend waits for `request_timeout_secs`. With
//! probes after 60 s of silence, every 10 s, the kernel fails such a connection after about 90 s;
//! the proxy then drops the other side (which makes vLLM abort) or answers 502.

pub mod body;
pub mod client;
pub mod headers;
pub mod listen;
pub mod timer_floor;

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Silence before the first probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// Between probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel fails the connection.
pub const KEEPALIVE_PROBES: u32 = 3;

/// Sets TCP_NODELAY and keep-alive on `stream` (best effort: a failure is logged, not fatal).
pub fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let ka = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "cannot set TCP keep-alive");
    }
}

/// Whether `id` can travel as a path segment unescaped (vLLM's ids are `resp_<hex>`).
pub fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_and_opened_connections_probe_a_silent_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let opened = TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        for s in [&opened, &accepted] {
            tune(s);
            let r = SockRef::from(s);
            assert!(r.keepalive().expect("SO_KEEPALIVE"));
            assert_eq!(
                r.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
                KEEPALIVE_IDLE
            );
            assert_eq!(
                r.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
                KEEPALIVE_INTERVAL
            );
            assert_eq!(
                r.tcp_keepalive_retries().expect("TCP_KEEPCNT"),
                KEEPALIVE_PROBES
            );
            assert!(s.nodelay().expect("nodelay"));
        }
    }
}
