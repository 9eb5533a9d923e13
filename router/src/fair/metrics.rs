//! Fair queueing's Prometheus series (`program_router_fair_*`), registered once per router and
//! shared by every runtime a reload builds.

use crate::observe::metrics::register;
use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Fair-queueing series (registered once per process).
#[derive(Clone)]
pub struct FairMetrics {
    pub(crate) depth: IntGaugeVec,
    pub(crate) tenant_depth: IntGaugeVec,
    pub(crate) wait: HistogramVec,
    pub(crate) outcomes: IntCounterVec,
    pub(crate) jain: Gauge,
    pub(crate) served: GaugeVec,
}

impl FairMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let depth = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "program_router_fair_queue_depth",
                    "Requests waiting in the router's fair queue, by class",
                ),
                &["class"],
            )?,
        )?;
        let tenant_depth = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "program_router_fair_tenant_queue_depth",
                    "Requests waiting per tenant (the top tenants by depth; the rest summed as `other`)",
                ),
                &["tenant"],
            )?,
        )?;
        let wait = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "program_router_fair_wait_seconds",
                    "Time from arrival to dispatch, by class",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0,
                ]),
                &["class"],
            )?,
        )?;
        let outcomes = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "program_router_fair_requests_total",
                    "Requests by class and outcome (dispatched, queue_full, timeout, cancelled)",
                ),
                &["class", "outcome"],
            )?,
        )?;
        let jain = register(
            registry,
            Gauge::new(
                "program_router_fair_jain_index",
                "Jain's fairness index over the weighted tokens served per tenant (1 = equal shares)",
            )?,
        )?;
        let served = register(
            registry,
            GaugeVec::new(
                Opts::new(
                    "program_router_fair_served_tokens",
                    "Weighted tokens served (the VTC service), for the top tenants",
                ),
                &["tenant"],
            )?,
        )?;
        Ok(FairMetrics {
            depth,
            tenant_depth,
            wait,
            outcomes,
            jain,
            served,
        })
    }
}
