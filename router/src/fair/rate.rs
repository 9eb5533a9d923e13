//! Per-tenant rate limits: requests and tokens per minute, as token buckets.
//!
//! Fair queueing shares what the backends can do between the tenants that want it; a rate limit
//! caps what one tenant may take even when nobody else is asking (a quota). Each tenant has a
//! request bucket and a token bucket, each holding at most one minute's allowance and refilled
//! continuously. A request is admitted while its tenant has a whole request left and a positive
//! token balance; it is charged one request and an estimate of its prompt at once, and the rest
//! (the real prompt and the generated tokens, from the backend's usage) when it finishes, which
//! may take the balance below zero: the tenant then waits until the refill pays the debt. So a
//! single large request is never refused for its size, and no tenant exceeds its allowance by
//! more than what it had in flight.
//!
//! With several router replicas (`peers`) each replica also counts what it admitted per tenant
//! ([`RateLimiter::totals`]) and charges its own buckets with what the others admitted
//! ([`RateLimiter::absorb`], fed every second by [`crate::peers`]), so a quota holds across the
//! replicas; a burst can pass it by what the replicas admit in the second before they hear of
//! each other.
//!
//! Pure: every call takes the time explicitly.

use std::time::Instant;

use rustc_hash::FxHashMap;

/// One tenant's limits (per minute; `None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub requests_per_minute: Option<f64>,
    pub tokens_per_minute: Option<f64>,
}

impl From<&crate::config::fairness::RateLimitConfig> for Limits {
    fn from(c: &crate::config::fairness::RateLimitConfig) -> Self {
        Limits {
            requests_per_minute: c.requests_per_minute,
            tokens_per_minute: c.tokens_per_minute,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Buckets {
    requests: f64,
    tokens: f64,
    at: Instant,
    /// The limits of the tenant's last request (to tell when the buckets are full again).
    limits: Limits,
}

/// Why a request was refused, and when to come back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverQuota {
    /// `true`: the token allowance; `false`: the request allowance.
    pub tokens: bool,
    /// Seconds until the request would be admitted, at least 1.
    pub retry_after_secs: u64,
}

/// Most tenants kept; beyond it, tenants whose buckets are full again (no state worth keeping)
/// are forgotten.
const MAX_TENANTS: usize = 10_000;

/// The buckets of every tenant seen recently.
#[derive(Debug, Default)]
pub struct RateLimiter {
    tenants: FxHashMap<String, Buckets>,
    /// Requests and tokens charged here per limited tenant since this limiter was made
    /// (admissions and settlements, never what was absorbed from other replicas).
    totals: FxHashMap<String, (f64, f64)>,
}

fn per_second(per_minute: f64) -> f64 {
    per_minute / 60.0
}

impl Buckets {
    fn full(l: &Limits, now: Instant) -> Self {
        Buckets {
            requests: l.requests_per_minute.unwrap_or(0.0),
            tokens: l.tokens_per_minute.unwrap_or(0.0),
            at: now,
            limits: *l,
        }
    }

    fn refill(&mut self, l: &Limits, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        if let Some(r) = l.requests_per_minute {
            self.requests = (self.requests + dt * per_second(r)).min(r);
        }
        if let Some(t) = l.tokens_per_minute {
            self.tokens = (self.tokens + dt * per_second(t)).min(t);
        }
    }

    fn is_full(&self, l: &Limits) -> bool {
        l.requests_per_minute.is_none_or(|r| self.requests >= r)
            && l.tokens_per_minute.is_none_or(|t| self.tokens >= t)
    }
}

impl RateLimiter {
    /// `tenant`'s buckets refilled to `now` under `l` (full for a newcomer); `None` for a tenant
    /// without limits, which keeps no state.
    fn buckets(&mut self, tenant: &str, l: &Limits, now: Instant) -> Option<&mut Buckets> {
        if l.requests_per_minute.is_none() && l.tokens_per_minute.is_none() {
            return None;
        }
        if !self.tenants.contains_key(tenant) {
            if self.tenants.len() >= MAX_TENANTS {
                self.prune(now);
            }
            // Only a newcomer allocates its name.
            self.tenants
                .insert(tenant.to_string(), Buckets::full(l, now));
        }
        let b = self.tenants.get_mut(tenant)?;
        b.refill(l, now);
        b.limits = *l;
        Some(b)
    }

    /// Admits one request of `tenant` and charges it one request and `estimate` tokens, or says
    /// which allowance is spent and for how long.
    pub fn admit(
        &mut self,
        tenant: &str,
        l: &Limits,
        estimate: u64,
        now: Instant,
    ) -> Result<(), OverQuota> {
        let Some(b) = self.buckets(tenant, l, now) else {
            return Ok(());
        };
        if let Some(r) = l.requests_per_minute
            && b.requests < 1.0
        {
            return Err(OverQuota {
                tokens: false,
                retry_after_secs: wait(1.0 - b.requests, r),
            });
        }
        if let Some(t) = l.tokens_per_minute
            && b.tokens <= 0.0
        {
            return Err(OverQuota {
                tokens: true,
                // Until the balance is positive again (a token more than the debt).
                retry_after_secs: wait(1.0 - b.tokens, t),
            });
        }
        if l.requests_per_minute.is_some() {
            b.requests -= 1.0;
        }
        if l.tokens_per_minute.is_some() {
            b.tokens -= estimate as f64;
        }
        self.count(tenant, 1.0, estimate as f64);
        Ok(())
    }

    /// Adds to `tenant`'s totals (bounded: beyond the tenant limit the totals start over, which
    /// the other replicas read as this one restarting).
    fn count(&mut self, tenant: &str, requests: f64, tokens: f64) {
        if let Some(t) = self.totals.get_mut(tenant) {
            t.0 += requests;
            t.1 += tokens;
            return;
        }
        if self.totals.len() >= MAX_TENANTS {
            self.totals.clear();
        }
        self.totals.insert(tenant.to_string(), (requests, tokens));
    }

    /// Requests and tokens charged here per tenant since this limiter was made.
    pub fn totals(&self) -> impl Iterator<Item = (&str, f64, f64)> {
        self.totals.iter().map(|(t, (r, k))| (t.as_str(), *r, *k))
    }

    /// Charges `tenant`'s buckets with what another replica admitted (`requests`, `tokens`;
    /// negative tokens give back an over-estimate), without admitting anything here. The
    /// balance may go below zero: the tenant then waits here too.
    pub fn absorb(&mut self, tenant: &str, l: &Limits, requests: f64, tokens: f64, now: Instant) {
        let Some(b) = self.buckets(tenant, l, now) else {
            return;
        };
        if let Some(r) = l.requests_per_minute {
            b.requests = (b.requests - requests).min(r);
        }
        if let Some(t) = l.tokens_per_minute {
            b.tokens = (b.tokens - tokens).min(t);
        }
    }

    /// Charges what a finished request really used beyond the estimate charged at admission
    /// (negative: gives back an over-estimate).
    pub fn settle(&mut self, tenant: &str, l: &Limits, estimate: u64, used: u64, now: Instant) {
        if l.tokens_per_minute.is_none() {
            return;
        }
        if let Some(b) = self.tenants.get_mut(tenant) {
            b.refill(l, now);
            b.tokens -= used as f64 - estimate as f64;
            if let Some(t) = l.tokens_per_minute {
                b.tokens = b.tokens.min(t);
            }
        }
        self.count(tenant, 0.0, used as f64 - estimate as f64);
    }

    /// Forgets tenants whose buckets are full again (a refill to the top is the same as never
    /// having been seen).
    fn prune(&mut self, now: Instant) {
        self.tenants.retain(|_, b| {
            let l = b.limits;
            b.refill(&l, now);
            !b.is_full(&l)
        });
    }
}

/// Whole seconds (at least 1) until `missing` units come back at `per_minute`.
fn wait(missing: f64, per_minute: f64) -> u64 {
    let secs = missing / per_second(per_minute);
    (secs.ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const RPM: Limits = Limits {
        requests_per_minute: Some(2.0),
        tokens_per_minute: None,
    };
    const TPM: Limits = Limits {
        requests_per_minute: None,
        tokens_per_minute: Some(600.0),
    };

    #[test]
    fn requests_per_minute_allow_a_burst_then_refill() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        assert!(r.admit("a", &RPM, 0, t0).is_ok());
        assert!(r.admit("a", &RPM, 0, t0).is_ok());
        let no = r.admit("a", &RPM, 0, t0).expect_err("spent");
        assert_eq!(
            no,
            OverQuota {
                tokens: false,
                retry_after_secs: 30
            }
        );
        assert!(
            r.admit("b", &RPM, 0, t0).is_ok(),
            "another tenant has its own"
        );
        // 2 per minute: one comes back every 30 s.
        assert!(r.admit("a", &RPM, 0, t0 + Duration::from_secs(29)).is_err());
        assert!(r.admit("a", &RPM, 0, t0 + Duration::from_secs(30)).is_ok());
        assert!(r.admit("a", &RPM, 0, t0 + Duration::from_secs(31)).is_err());
    }

    #[test]
    fn tokens_are_charged_by_estimate_then_settled_and_a_debt_waits() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        // A request larger than the whole allowance is admitted (never refused for its size).
        assert!(r.admit("a", &TPM, 100, t0).is_ok());
        r.settle("a", &TPM, 100, 900, t0);
        // Balance 600 - 900 = -300: 10 tokens/s, so 31 s until it is positive.
        let no = r.admit("a", &TPM, 10, t0).expect_err("in debt");
        assert_eq!(
            no,
            OverQuota {
                tokens: true,
                retry_after_secs: 31
            }
        );
        assert!(r.admit("a", &TPM, 10, t0 + Duration::from_secs(31)).is_ok());
        // An over-estimate is given back, never above a minute's allowance.
        let mut r = RateLimiter::default();
        assert!(r.admit("a", &TPM, 500, t0).is_ok());
        r.settle("a", &TPM, 500, 50, t0);
        assert!(r.admit("a", &TPM, 0, t0).is_ok());
        r.settle("a", &TPM, 0, 0, t0);
        assert_eq!(r.tenants.get("a").map(|b| b.tokens), Some(550.0));
    }

    #[test]
    fn unlimited_tenants_keep_no_state_and_full_buckets_are_forgotten() {
        let mut r = RateLimiter::default();
        let none = Limits {
            requests_per_minute: None,
            tokens_per_minute: None,
        };
        let t0 = Instant::now();
        assert!(r.admit("a", &none, 5, t0).is_ok());
        assert_eq!(r.tenants.len(), 0);
        for i in 0..MAX_TENANTS {
            r.admit(&format!("t{i}"), &RPM, 0, t0).expect("first");
        }
        // A minute later every bucket is full again: room for newcomers.
        let later = t0 + Duration::from_secs(60);
        r.admit("new", &RPM, 0, later).expect("admitted");
        assert_eq!(r.tenants.len(), 1);
    }

    #[test]
    fn totals_count_what_was_charged_here_and_absorb_charges_what_others_admitted() {
        let both = Limits {
            requests_per_minute: Some(4.0),
            tokens_per_minute: Some(1000.0),
        };
        let mut a = RateLimiter::default();
        let t0 = Instant::now();
        a.admit("x", &both, 100, t0).expect("one");
        a.settle("x", &both, 100, 250, t0);
        let totals: Vec<_> = a.totals().collect();
        assert_eq!(totals, vec![("x", 1.0, 250.0)]);
        // Another replica admitted three more of x's requests: one is left here.
        a.absorb("x", &both, 3.0, 300.0, t0);
        assert!(
            a.admit("x", &both, 10, t0).is_err(),
            "4 of 4 per minute used"
        );
        assert_eq!(
            a.totals().collect::<Vec<_>>(),
            vec![("x", 1.0, 250.0)],
            "absorbed use is not re-exported"
        );
        // A tenant first seen through another replica starts from a full bucket.
        let mut b = RateLimiter::default();
        b.absorb("y", &both, 4.0, 0.0, t0);
        assert!(b.admit("y", &both, 0, t0).is_err());
        assert!(b.admit("y", &both, 0, t0 + Duration::from_secs(15)).is_ok());
        // An over-estimate given back elsewhere never fills a bucket past its allowance.
        b.absorb("z", &both, 0.0, -5000.0, t0);
        assert_eq!(b.tenants.get("z").map(|x| x.tokens), Some(1000.0));
    }
}
