//! A timer kept pending on each single-threaded runtime that serves requests, so that the
//! timers requests set do not wake the runtime's own I/O driver.
//!
//! Tokio wakes a runtime's I/O driver (an eventfd write, then an epoll wait that returns at
//! once) whenever a timer is set to expire before the earliest one pending when the driver last
//! parked, even from the driver's own thread while it runs tasks (tokio-rs/tokio#5207). Every
//! request sets several (hyper's header read, the body read, the request deadline, the
//! upstream's timeouts), each a second or more away, and with nothing else pending each one
//! could be the earliest (what that cost: docs/benchmarks.md, router overhead). With a timer
//! always pending at most [`FLOOR`] away, none of them is.

use std::time::Duration;

/// How far ahead a runtime running [`keep_a_timer_pending`] always has a timer: one wake a
/// second when idle.
pub const FLOOR: Duration = Duration::from_secs(1);

/// Keeps a timer pending on the current runtime, [`FLOOR`] away at most, until the runtime
/// ends. Spawned once on each I/O shard's runtime.
pub async fn keep_a_timer_pending() {
    let mut tick = tokio::time::interval(FLOOR);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parks of a fresh single-threaded runtime while it sets and drops a 5 s timer, then waits
    /// 5 ms for another thread, `rounds` times; with the floor or without it.
    fn parks(floor: bool, rounds: u32) -> u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            if floor {
                tokio::spawn(keep_a_timer_pending());
                tokio::task::yield_now().await;
            }
            for _ in 0..rounds {
                // A request's timeout: set, polled once, dropped before it fires.
                let timeout = tokio::time::sleep(Duration::from_secs(5));
                let _ = futures_util::poll!(Box::pin(timeout));
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(5));
                    let _ = tx.send(());
                });
                let _ = rx.await;
            }
        });
        rt.metrics().worker_park_count(0)
    }

    #[test]
    fn with_a_timer_pending_a_request_timer_does_not_wake_the_driver() {
        let rounds = 40;
        let (with, without) = (parks(true, rounds), parks(false, rounds));
        // Without the floor each timer wakes the driver once more (tokio-rs/tokio#5207): should
        // this half fail, tokio no longer does, and the floor can go.
        assert!(
            without >= u64::from(rounds) * 5 / 4,
            "{without} parks without the floor in {rounds} rounds"
        );
        assert!(
            with < u64::from(rounds) * 5 / 4,
            "{with} parks with the floor in {rounds} rounds ({without} without)"
        );
    }
}
