//! Leader fencing: the leading replica stops acting before another one can take the Lease.
//!
//! The lease manager renews the Lease in the background and, when the API server cannot be
//! reached, keeps retrying without ever saying the lease is lost. Another replica takes the
//! Lease once its `renewTime + leaseDurationSeconds` has passed (wall clocks, as the lease
//! manager compares them). So the leader reads the Lease itself every [`CHECK_EVERY`]; it keeps
//! acting only while the last Lease it could read names it and has not come within
//! [`MARGIN`] of that expiry — a leader cut off from the API server stops on its own, before a
//! standby's takeover, and so never writes after its lease ran out.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

/// How often the leader reads its Lease.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long before the lease's expiry the leader stops (clock skew between replicas, a
/// reconcile in flight).
pub const MARGIN: Duration = Duration::from_secs(3);

/// When the Lease `l` held by `me` expires; `None` when it names another holder or no time.
pub fn held_until(l: &Lease, me: &str) -> Option<SystemTime> {
    let spec = l.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(me) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let secs = u64::try_from(spec.lease_duration_seconds?).ok()?;
    Some(renewed + Duration::from_secs(secs))
}

/// Whether a leader whose last read Lease expires at `until` must stop at `now`.
pub fn must_stop(until: SystemTime, now: SystemTime) -> bool {
    now + MARGIN >= until
}

/// Resolves when this replica must stop leading: the Lease names someone else, or the last one
/// it could read is about to expire (the API server unreachable, renewals not landing).
pub async fn lost(api: Api<Lease>, name: String, me: String) {
    let mut until: Option<SystemTime> = None;
    loop {
        match api.get_opt(&name).await {
            Ok(Some(l)) => match held_until(&l, &me) {
                Some(t) => until = Some(t),
                None => {
                    tracing::warn!(lease = %name, "the Lease names another holder");
                    return;
                }
            },
            Ok(None) => {
                tracing::warn!(lease = %name, "the Lease is gone");
                return;
            }
            Err(e) => tracing::warn!(lease = %name, error = %e, "cannot read the Lease"),
        }
        if until.is_some_and(|t| must_stop(t, SystemTime::now())) {
            tracing::warn!(lease = %name, "the Lease was not renewed in time; stopping before it expires");
            return;
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: SystemTime, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::try_from(renewed).expect("a timestamp"),
                )),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_leader_stops_before_its_lease_can_be_taken() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let l = lease("op-a", t0, 15);
        let until = held_until(&l, "op-a").expect("held");
        assert_eq!(until, t0 + Duration::from_secs(15));
        assert!(held_until(&l, "op-b").is_none(), "another holder");
        assert!(!must_stop(until, t0 + Duration::from_secs(10)));
        assert!(must_stop(until, t0 + Duration::from_secs(12)), "3 s before");
        assert!(must_stop(until, t0 + Duration::from_secs(15)));
        // A standby takes over only once the expiry has passed: the leader stopped first.
        assert!(must_stop(until, until - MARGIN));
    }
}
