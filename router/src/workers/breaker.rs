//! Circuit breaker of one target: closed → open after too many failures in a window, open →
//! half-open after a timeout, half-open → closed after enough successes (or open on a failure).
//!
//! Owns the state machine only; time is passed in, so it is tested without sleeping. A closed
//! circuit is also mirrored in an atomic: every request asks and most succeed, and neither needs
//! the lock (which all I/O threads share) while the circuit is closed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::config::CircuitBreakerConfig;

/// Externally visible state (the metric value in parentheses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Requests flow (0).
    Closed,
    /// Requests are refused until the timeout passes (1).
    Open,
    /// Trial requests decide (2).
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    pub fn metric(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::Open => 1,
            CircuitState::HalfOpen => 2,
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: CircuitState,
    failures: u32,
    window_start: Instant,
    successes: u32,
    opened_at: Instant,
}

/// A circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    cfg: CircuitBreakerConfig,
    inner: Mutex<Inner>,
    /// `inner.state == Closed`, written under the lock whenever the state changes.
    closed: AtomicBool,
}

impl Breaker {
    pub fn new(cfg: CircuitBreakerConfig, now: Instant) -> Self {
        Breaker {
            cfg,
            inner: Mutex::new(Inner {
                state: CircuitState::Closed,
                failures: 0,
                window_start: now,
                successes: 0,
                opened_at: now,
            }),
            closed: AtomicBool::new(true),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current state; an open circuit whose timeout passed becomes half-open.
    pub fn state(&self, now: Instant) -> CircuitState {
        if self.closed.load(Ordering::Acquire) {
            return CircuitState::Closed;
        }
        let mut g = self.lock();
        if g.state == CircuitState::Open
            && now.duration_since(g.opened_at)
                >= crate::config::duration(self.cfg.timeout_duration_secs)
        {
            g.state = CircuitState::HalfOpen;
            g.successes = 0;
        }
        g.state
    }

    /// Whether a request may be sent now.
    pub fn allows(&self, now: Instant) -> bool {
        !self.cfg.enabled || self.state(now) != CircuitState::Open
    }

    /// Whether recording this outcome would change nothing (the breaker is off, or a success
    /// on a closed circuit), known without the clock or the lock.
    pub fn unchanged_by(&self, success: bool) -> bool {
        !self.cfg.enabled || (success && self.closed.load(Ordering::Acquire))
    }

    /// Records an outcome; returns the new state if it changed.
    pub fn record(&self, success: bool, now: Instant) -> Option<CircuitState> {
        if self.unchanged_by(success) {
            return None;
        }
        let before = self.state(now);
        let mut g = self.lock();
        match (g.state, success) {
            (CircuitState::Closed, true) => {}
            (CircuitState::Closed, false) => {
                if now.duration_since(g.window_start)
                    > crate::config::duration(self.cfg.window_duration_secs)
                {
                    g.window_start = now;
                    g.failures = 0;
                }
                g.failures += 1;
                if g.failures >= self.cfg.failure_threshold {
                    g.state = CircuitState::Open;
                    g.opened_at = now;
                }
            }
            (CircuitState::HalfOpen, true) => {
                g.successes += 1;
                if g.successes >= self.cfg.success_threshold {
                    g.state = CircuitState::Closed;
                    g.failures = 0;
                    g.window_start = now;
                }
            }
            (CircuitState::HalfOpen, false) => {
                g.state = CircuitState::Open;
                g.opened_at = now;
            }
            (CircuitState::Open, _) => {}
        }
        self.closed
            .store(g.state == CircuitState::Closed, Ordering::Release);
        (g.state != before).then_some(g.state)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cfg() -> CircuitBreakerConfig {
        CircuitBreakerConfig {
            enabled: true,
            failure_threshold: 3,
            success_threshold: 2,
            timeout_duration_secs: 10.0,
            window_duration_secs: 60.0,
        }
    }

    #[test]
    fn opens_probes_and_closes() {
        let t0 = Instant::now();
        let b = Breaker::new(cfg(), t0);
        assert_eq!(b.record(false, t0), None);
        assert_eq!(b.record(false, t0), None);
        assert_eq!(b.record(false, t0), Some(CircuitState::Open));
        assert!(!b.allows(t0 + Duration::from_secs(5)));
        assert_eq!(
            b.state(t0 + Duration::from_secs(10)),
            CircuitState::HalfOpen
        );
        // A half-open circuit counts successes: they are not skipped.
        assert!(!b.unchanged_by(true));
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(b.record(true, t1), None);
        assert_eq!(b.record(true, t1), Some(CircuitState::Closed));
        // Closed again: a success changes nothing, a failure counts.
        assert!(b.unchanged_by(true));
        assert!(!b.unchanged_by(false));
        assert_eq!(b.state(t1), CircuitState::Closed);
    }

    #[test]
    fn half_open_failure_reopens_and_old_failures_expire() {
        let t0 = Instant::now();
        let b = Breaker::new(cfg(), t0);
        for _ in 0..3 {
            b.record(false, t0);
        }
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(b.record(false, t1), Some(CircuitState::Open));
        assert!(!b.allows(t1 + Duration::from_secs(1)));
        // Failures spread beyond the window never open a closed circuit.
        let b = Breaker::new(cfg(), t0);
        for i in 0..6 {
            assert_eq!(b.record(false, t0 + Duration::from_secs(61 * i)), None);
            b.record(false, t0 + Duration::from_secs(61 * i));
            // two per window stay below the threshold of three
        }
        assert!(b.allows(t0 + Duration::from_secs(400)));
    }

    #[test]
    fn disabled_never_opens() {
        let t0 = Instant::now();
        let b = Breaker::new(
            CircuitBreakerConfig {
                enabled: false,
                ..cfg()
            },
            t0,
        );
        for _ in 0..100 {
            assert_eq!(b.record(false, t0), None);
        }
        assert!(b.allows(t0));
    }
}
