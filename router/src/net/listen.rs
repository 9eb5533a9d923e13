//! Closing a listening socket without resetting a client the kernel already accepted.
//!
//! Closing a listener resets every connection whose handshake completed after the last
//! `accept`: the client sent its request and gets a reset. So a listener stops in three steps:
//! the kernel stops starting handshakes (a socket filter drops new SYNs; such a client
//! retransmits and is refused once the socket is closed, before it has sent anything), the
//! handshakes under way complete during [`HANDSHAKE_GRACE`] and are served, and only then is the
//! accept queue drained and the socket closed.

use std::os::fd::AsFd;
use std::time::Duration;

/// How long handshakes under way (SYN-ACK sent, ACK not yet back) may take to complete once no
/// new one starts: a round trip, with room for a loaded machine.
pub const HANDSHAKE_GRACE: Duration = Duration::from_millis(100);

/// A classic BPF program over the TCP header (where a socket filter on a TCP socket starts):
/// drop a segment with SYN set and ACK clear — a client opening a connection — and keep every
/// other one (handshakes completing, data on accepted connections, which inherit the filter).
#[cfg(target_os = "linux")]
fn refuse_syn() -> [socket2::SockFilter; 5] {
    use socket2::SockFilter;
    const LD_B_ABS: u16 = 0x30; // A = packet[k] (one byte)
    const AND_K: u16 = 0x54; // A &= k
    const JEQ_K: u16 = 0x15; // A == k ? skip jt : skip jf
    const RET_K: u16 = 0x06; // keep k bytes (0 drops)
    const TCP_FLAGS: u32 = 13;
    const SYN: u32 = 0x02;
    const ACK: u32 = 0x10;
    [
        SockFilter::new(LD_B_ABS, 0, 0, TCP_FLAGS),
        SockFilter::new(AND_K, 0, 0, SYN | ACK),
        SockFilter::new(JEQ_K, 0, 1, SYN),
        SockFilter::new(RET_K, 0, 0, 0),
        SockFilter::new(RET_K, 0, 0, u32::MAX),
    ]
}

/// Makes the kernel stop starting handshakes on `listener` (every copy of its descriptor);
/// connections already accepted or completing are untouched. Best effort: where the filter
/// cannot be attached (not Linux, a sandbox forbidding it) it logs and the listener closes as
/// before, resetting clients that connect in the moment it closes.
pub fn refuse_new_handshakes(listener: &impl AsFd) -> bool {
    #[cfg(target_os = "linux")]
    {
        match socket2::SockRef::from(listener).attach_filter(&refuse_syn()) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot stop new handshakes before closing a listener");
                false
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = listener;
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::*;

    fn try_connect(addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
        TcpStream::connect_timeout(&addr, Duration::from_millis(300))
    }

    #[test]
    fn a_refusing_listener_keeps_its_connections_and_starts_no_new_one() {
        refuses_on(TcpListener::bind("127.0.0.1:0").expect("bind"));
    }

    #[test]
    fn the_filter_reads_the_tcp_header_over_ipv6_too() {
        // Where the machine has no IPv6 loopback there is nothing to check.
        if let Ok(l) = TcpListener::bind("[::1]:0") {
            refuses_on(l);
        }
    }

    fn refuses_on(l: TcpListener) {
        let addr = l.local_addr().expect("addr");
        let mut before = try_connect(addr).expect("connect before");
        let (mut accepted, _) = l.accept().expect("accept");
        assert!(refuse_new_handshakes(&l));
        // A new client's SYN is dropped: its connect does not complete.
        let e = try_connect(addr).expect_err("a new handshake completed");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        // The accepted connection carries data both ways.
        before.write_all(b"ping").expect("write");
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"ping");
        accepted.write_all(b"pong").expect("write back");
        before.read_exact(&mut buf).expect("read back");
        assert_eq!(&buf, b"pong");
        // Nothing reached the accept queue.
        l.set_nonblocking(true).expect("nonblocking");
        assert!(l.accept().is_err());
        // Once closed, a client is refused, not reset after connecting.
        drop(l);
        let e = try_connect(addr).expect_err("connected to a closed listener");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    }
}
