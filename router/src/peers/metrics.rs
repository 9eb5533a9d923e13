//! The peers feature's Prometheus series (`program_router_peer_*`): forwards, hand-overs,
//! quota-use reads, member lists and refused peer calls.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::observe::metrics::{register, with_zeros};

#[derive(Clone)]
pub struct PeerMetrics {
    /// Program requests handed between router replicas, by outcome.
    pub forwards: IntCounterVec,
    /// Reads of the other replicas' quota use, by outcome.
    pub usage_reads: IntCounterVec,
    /// Programs handed between router replicas when their owner changed, by event.
    pub handovers: IntCounterVec,
    /// Requests the peer listener refused for want of the peer secret.
    pub auth_failures: IntCounter,
    /// Member lists read from another replica that told of a newer revision, by outcome.
    pub member_lists: IntCounterVec,
}

impl PeerMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        Ok(PeerMetrics {
            forwards: register(
                registry,
                with_zeros(
                    IntCounterVec::new(
                        Opts::new(
                            "program_router_peer_forwards_total",
                            "Program requests forwarded to the replica that owns them (forwarded), \
                     passed to the next owner because the owner was unreachable or shutting down \
                     (unreachable), sent again because the owner closed the connection without \
                     answering (closed), failed on the way (failed), or received from another \
                     replica (received).",
                        ),
                        &["outcome"],
                    )?,
                    &["forwarded", "unreachable", "closed", "failed", "received"],
                ),
            )?,
            usage_reads: register(
                registry,
                with_zeros(
                    IntCounterVec::new(
                        Opts::new(
                            "program_router_peer_usage_reads_total",
                            "Reads of the other router replicas' quota use (once a second per replica \
                     while quotas are configured), by outcome (ok, error).",
                        ),
                        &["outcome"],
                    )?,
                    &["ok", "error"],
                ),
            )?,
            handovers: register(
                registry,
                with_zeros(
                    IntCounterVec::new(
                        Opts::new(
                            "program_router_peer_handovers_total",
                            "Programs handed between router replicas so that they keep their rank when \
                     their owner changes: taken from another replica on first sight (claimed), \
                     given to a replica that asked (given), given to the next owner while \
                     shutting down (pushed), or taken from a replica shutting down (adopted).",
                        ),
                        &["event"],
                    )?,
                    &["claimed", "given", "pushed", "adopted"],
                ),
            )?,
            auth_failures: register(
                registry,
                IntCounter::new(
                    "program_router_peer_auth_failures_total",
                    "Requests the peer listener refused (401) because they did not carry the peer \
                 secret: a misconfigured replica, or someone who is not one.",
                )?,
            )?,
            member_lists: register(
                registry,
                with_zeros(
                    IntCounterVec::new(
                        Opts::new(
                            "program_router_peer_member_lists_total",
                            "Member lists read from another router replica that told of a newer revision \
                     than the one in force: applied (adopted), no longer newer when read (stale), \
                     or unreadable or invalid (error).",
                        ),
                        &["outcome"],
                    )?,
                    &["adopted", "stale", "error"],
                ),
            )?,
        })
    }
}
