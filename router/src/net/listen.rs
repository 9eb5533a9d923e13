//! Closing a listening socket without resetting a client the kernel already accepted.
//!
//! Closing a listener resets every connection whose handshake completed after the last
//! `accept`: the client sent its request and gets a reset. So a listener stops in three steps:
//! the kernel stops starting handshakes (a socket filter drops new SYNs; such a client
//! retransmits and is refused once the socket is closed, before it has sent anything), the
//! handshakes under way complete and are served ([`handshakes_completed`] waits at least 100 ms
//! and until the kernel lists none for the listener's port), and only then is the accept queue
//! drained and the socket closed.

use std::os::fd::AsFd;
use std::time::Duration;

/// The least a stopping listener waits for handshakes under way (SYN-ACK sent, ACK not yet
/// back), and all it waits where the kernel's socket table cannot be read: a round trip, with
/// room for a loaded machine.
pub const HANDSHAKE_GRACE: Duration = Duration::from_millis(100);

/// The most a stopping listener waits for handshakes it sees under way: a client that vanished
/// mid-handshake stays listed while the kernel retransmits its SYN-ACK (about a minute).
pub const HANDSHAKE_GRACE_MAX: Duration = Duration::from_secs(1);

/// How often the socket table is read while handshakes are under way.
const HANDSHAKE_POLL: Duration = Duration::from_millis(5);

/// The kernel's socket tables, each listing a handshake under way as a `SYN_RECV` row.
const SOCKET_TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// A classic BPF program over the TCP header (where a socket filter on a TCP socket starts):
/// drop a segment whose SYN and ACK flags are `syn_ack` and keep every other one. A listener
/// drops SYN-without-ACK — a client opening a connection — and keeps handshakes completing and
/// data on accepted connections (which inherit the filter).
#[cfg(target_os = "linux")]
fn drop_segments_flagged(syn_ack: u32) -> [socket2::SockFilter; 5] {
    use socket2::SockFilter;
    const LD_B_ABS: u16 = 0x30; // A = packet[k] (one byte)
    const AND_K: u16 = 0x54; // A &= k
    const JEQ_K: u16 = 0x15; // A == k ? skip jt : skip jf
    const RET_K: u16 = 0x06; // keep k bytes (0 drops)
    const TCP_FLAGS: u32 = 13;
    [
        SockFilter::new(LD_B_ABS, 0, 0, TCP_FLAGS),
        SockFilter::new(AND_K, 0, 0, SYN | ACK),
        SockFilter::new(JEQ_K, 0, 1, syn_ack),
        SockFilter::new(RET_K, 0, 0, 0),
        SockFilter::new(RET_K, 0, 0, u32::MAX),
    ]
}

#[cfg(target_os = "linux")]
const SYN: u32 = 0x02;
#[cfg(target_os = "linux")]
const ACK: u32 = 0x10;

/// Makes the kernel stop starting handshakes on `listener` (every copy of its descriptor);
/// connections already accepted or completing are untouched. Best effort: where the filter
/// cannot be attached (not Linux, a sandbox forbidding it) it logs and the listener closes as
/// before, resetting clients that connect in the moment it closes.
pub fn refuse_new_handshakes(listener: &impl AsFd) -> bool {
    #[cfg(target_os = "linux")]
    {
        match socket2::SockRef::from(listener).attach_filter(&drop_segments_flagged(SYN)) {
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

/// Resolves once no handshake is under way on the listener at `port` (after
/// [`refuse_new_handshakes`], none starts): those under way when it stopped have completed and
/// wait in the accept queue. Waits [`HANDSHAKE_GRACE`] first (all it does where the socket table
/// cannot be read, and a floor where a sandbox's table does not list handshakes), then while the
/// kernel lists one, up to [`HANDSHAKE_GRACE_MAX`] in all. On a loaded machine the kernel can
/// finish a loopback handshake later than any fixed grace.
pub async fn handshakes_completed(port: u16) {
    let started = tokio::time::Instant::now();
    tokio::time::sleep(HANDSHAKE_GRACE).await;
    let mut waited_for = 0;
    loop {
        // procfs is read from memory: the read does not block on a device.
        match handshakes_under_way(port) {
            None | Some(0) => {
                if waited_for > 0 {
                    tracing::info!(
                        port,
                        handshakes = waited_for,
                        ms = started.elapsed().as_millis() as u64,
                        "handshakes under way completed before the listener closes"
                    );
                }
                return;
            }
            Some(n) if started.elapsed() >= HANDSHAKE_GRACE_MAX => {
                tracing::warn!(
                    port,
                    handshakes = n,
                    "handshakes still under way when the listener closes; their clients are reset"
                );
                return;
            }
            Some(n) => {
                waited_for = waited_for.max(n);
                tokio::time::sleep(HANDSHAKE_POLL).await;
            }
        }
    }
}

/// Handshakes under way on local `port` per the kernel's socket tables; `None` where no table
/// can be read (not Linux, no /proc).
pub fn handshakes_under_way(port: u16) -> Option<usize> {
    let mut read = false;
    let mut n = 0;
    for table in SOCKET_TABLES {
        if let Ok(text) = std::fs::read_to_string(table) {
            read = true;
            n += syn_recv_rows(&text, port);
        }
    }
    read.then_some(n)
}

/// Rows of a /proc/net/tcp{,6} table in state `SYN_RECV` (03) whose local port is `port`.
fn syn_recv_rows(table: &str, port: u16) -> usize {
    const SYN_RECV: &str = "03";
    table
        .lines()
        .skip(1)
        .filter(|row| {
            // Columns: slot, local address:port, remote address:port, state, ... (hex).
            let mut cols = row.split_whitespace().skip(1);
            let local_port = cols
                .next()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let state = cols.nth(1);
            local_port == Some(port) && state == Some(SYN_RECV)
        })
        .count()
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

    #[test]
    fn syn_recv_rows_are_counted_for_the_port_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n\
            1: 0100007F:1F90 0100007F:C350 03 00000000:00000000 01:00000064 00000000\n\
            2: 0100007F:1F90 0100007F:C351 01 00000000:00000000 00:00000000 00000000\n\
            3: 0100007F:1F91 0100007F:C352 03 00000000:00000000 01:00000064 00000000\n\
            4: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C353 03 0";
        assert_eq!(syn_recv_rows(table, 0x1F90), 2);
        assert_eq!(syn_recv_rows(table, 0x1F91), 1);
        assert_eq!(syn_recv_rows(table, 80), 0);
        assert_eq!(syn_recv_rows("garbage\nnot a row\n0: x", 0x1F90), 0);
    }

    /// A client whose socket drops SYN-ACKs stays mid-handshake: the listener's side is listed
    /// as under way until the client lets the SYN-ACK in, then the connection is accepted.
    #[test]
    fn a_handshake_under_way_is_listed_until_it_completes() {
        use socket2::{Domain, Socket, Type};
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let port = addr.port();
        if handshakes_under_way(port).is_none() {
            return; // no /proc: the fixed grace applies
        }
        let client = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        client
            .attach_filter(&drop_segments_flagged(SYN | ACK))
            .expect("client filter");
        client.set_nonblocking(true).expect("nonblocking");
        let _ = client.connect(&addr.into()); // EINPROGRESS
        let seen = wait_for(Duration::from_secs(2), || {
            handshakes_under_way(port) == Some(1)
        });
        assert!(seen, "the handshake under way was not listed");
        l.set_nonblocking(true).expect("nonblocking");
        assert!(
            l.accept().is_err(),
            "accepted before the handshake completed"
        );
        client.detach_filter().expect("detach");
        // The next SYN or SYN-ACK retransmission (about 1 s) completes it.
        let done = wait_for(Duration::from_secs(8), || {
            handshakes_under_way(port) == Some(0)
        });
        assert!(done, "the handshake stayed listed after it could complete");
        assert!(
            l.accept().is_ok(),
            "the completed handshake is not in the accept queue"
        );
    }

    fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        f()
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
