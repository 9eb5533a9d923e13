//! Fair multi-tenant queueing: which waiting request goes to the backend next.
//!
//! Pure, like the Program scheduler: requests are pushed with an explicit time and popped when the
//! caller's backpressure gate allows a class to send. Between priority classes the order is
//! strict; within a class, tenants are served by a Virtual Token Counter (the backlogged tenant
//! with the least weighted service goes next; service is `w_in·input + w_out·output` divided by the
//! tenant's weight; a tenant that becomes backlogged again is lifted to the minimum counter of the
//! backlogged tenants, so idling earns no credit) or by plain round robin. Per-tenant queue limits
//! and queue timeouts make every request end exactly once: dispatched, refused at the door, or
//! timed out. [`runtime`] wires it into the data plane (identity, gates from vLLM metrics, 429/504).

pub mod metrics;
pub mod rate;

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

/// The caller's id for a request.
pub type QueueTicket = u64;

/// Tenants remembered per class before idle ones are forgotten (see [`FairQueue::push`]).
const MAX_IDLE_TENANTS: usize = 1024;

/// How tenants share one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    /// Virtual Token Counter: token-fair.
    Vtc,
    /// Request-count round robin.
    RoundRobin,
}

/// Queueing parameters.
#[derive(Debug, Clone)]
pub struct FairParams {
    pub discipline: Discipline,
    /// Class names, highest priority first.
    pub classes: Vec<String>,
    pub input_weight: f64,
    pub output_weight: f64,
    /// Per-tenant share weights (default 1).
    pub tenant_weights: FxHashMap<String, f64>,
    /// Most queued requests per tenant (per class); more are refused.
    pub max_queue_per_tenant: usize,
    /// Longest a request may wait, seconds.
    pub queue_timeout: f64,
}

/// Why a push was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("tenant {0} has too many queued requests")]
    TenantQueueFull(String),
    #[error("unknown priority class {0}")]
    UnknownClass(String),
}

#[derive(Debug, Clone)]
struct Waiting {
    ticket: QueueTicket,
    input_tokens: u64,
    enqueued: f64,
}

#[derive(Debug, Default)]
struct Tenant {
    queue: VecDeque<Waiting>,
    counter: f64,
}

#[derive(Debug, Default)]
struct Class {
    tenants: BTreeMap<String, Tenant>,
    rr: usize,
    queued: usize,
}

/// A dispatched request: which tenant and class to charge output to on completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched {
    pub ticket: QueueTicket,
    pub tenant: String,
    pub class: usize,
    pub waited: f64,
}

/// The queue.
pub struct FairQueue {
    p: FairParams,
    classes: Vec<Class>,
}

impl FairQueue {
    pub fn new(p: FairParams) -> Self {
        let classes = p.classes.iter().map(|_| Class::default()).collect();
        FairQueue { p, classes }
    }

    /// New parameters for the same classes and discipline (the caller checks); queued requests
    /// and each tenant's counters stay. A new queue timeout counts from when each was queued.
    pub fn set_params(&mut self, p: FairParams) {
        self.p = p;
    }

    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.p.classes.iter().position(|c| c == name)
    }

    fn weight(&self, tenant: &str) -> f64 {
        self.p
            .tenant_weights
            .get(tenant)
            .copied()
            .filter(|w| *w > 0.0)
            .unwrap_or(1.0)
    }

    /// Queued requests of a class.
    pub fn queued(&self, class: usize) -> usize {
        self.classes.get(class).map_or(0, |c| c.queued)
    }

    /// A tenant's counter in a class (weighted service so far).
    pub fn counter(&self, class: usize, tenant: &str) -> Option<f64> {
        self.classes
            .get(class)?
            .tenants
            .get(tenant)
            .map(|t| t.counter)
    }

    /// Queues a request.
    pub fn push(
        &mut self,
        now: f64,
        ticket: QueueTicket,
        tenant: &str,
        class: &str,
        input_tokens: u64,
    ) -> Result<(), Refused> {
        let ci = self
            .class_index(class)
            .ok_or_else(|| Refused::UnknownClass(class.to_string()))?;
        let max = self.p.max_queue_per_tenant;
        let c = &mut self.classes[ci];
        // Lift a returning tenant to the least counter among the backlogged ones.
        let floor = c
            .tenants
            .iter()
            .filter(|(name, t)| !t.queue.is_empty() && name.as_str() != tenant)
            .map(|(_, t)| t.counter)
            .fold(f64::INFINITY, f64::min);
        if c.tenants.len() > MAX_IDLE_TENANTS {
            // Forget idle tenants whose counter is at or below the floor: on return they would
            // be lifted to it anyway, so only memory changes.
            c.tenants
                .retain(|name, t| !t.queue.is_empty() || t.counter > floor || name == tenant);
        }
        let t = c.tenants.entry(tenant.to_string()).or_default();
        if t.queue.len() >= max {
            return Err(Refused::TenantQueueFull(tenant.to_string()));
        }
        if t.queue.is_empty() && floor.is_finite() && t.counter < floor {
            t.counter = floor;
        }
        t.queue.push_back(Waiting {
            ticket,
            input_tokens,
            enqueued: now,
        });
        c.queued += 1;
        Ok(())
    }

    /// The next request of the highest-priority class whose gate is open, if any.
    pub fn pop(&mut self, now: f64, gate: impl Fn(usize) -> bool) -> Option<Dispatched> {
        for ci in 0..self.classes.len() {
            if self.classes[ci].queued == 0 || !gate(ci) {
                continue;
            }
            let c = &self.classes[ci];
            let backlogged: Vec<&String> = c
                .tenants
                .iter()
                .filter(|(_, t)| !t.queue.is_empty())
                .map(|(n, _)| n)
                .collect();
            let name = match self.p.discipline {
                Discipline::Vtc => backlogged
                    .iter()
                    .min_by(|a, b| c.tenants[**a].counter.total_cmp(&c.tenants[**b].counter))
                    .map(|n| (*n).clone()),
                Discipline::RoundRobin => backlogged
                    .get(c.rr % backlogged.len().max(1))
                    .map(|n| (*n).clone()),
            }?;
            let w = self.weight(&name);
            let input_weight = self.p.input_weight;
            let c = &mut self.classes[ci];
            c.rr = c.rr.wrapping_add(1);
            let t = c.tenants.get_mut(&name)?;
            let item = t.queue.pop_front()?;
            t.counter += input_weight * item.input_tokens as f64 / w;
            c.queued -= 1;
            return Some(Dispatched {
                ticket: item.ticket,
                tenant: name,
                class: ci,
                waited: now - item.enqueued,
            });
        }
        None
    }

    /// Charges a finished request's output tokens to its tenant.
    pub fn complete(&mut self, d: &Dispatched, output_tokens: u64) {
        let w = self.weight(&d.tenant);
        let ow = self.p.output_weight;
        if let Some(t) = self
            .classes
            .get_mut(d.class)
            .and_then(|c| c.tenants.get_mut(&d.tenant))
        {
            t.counter += ow * output_tokens as f64 / w;
        }
    }

    /// Removes a request whose client left; `true` if it was queued.
    pub fn cancel(&mut self, ticket: QueueTicket) -> bool {
        for c in &mut self.classes {
            for t in c.tenants.values_mut() {
                if let Some(pos) = t.queue.iter().position(|w| w.ticket == ticket) {
                    t.queue.remove(pos);
                    c.queued -= 1;
                    return true;
                }
            }
        }
        false
    }

    /// Removes and returns every request that waited longer than the queue timeout.
    pub fn expire(&mut self, now: f64) -> Vec<QueueTicket> {
        let limit = self.p.queue_timeout;
        let mut out = Vec::new();
        for c in &mut self.classes {
            for t in c.tenants.values_mut() {
                while t.queue.front().is_some_and(|w| now - w.enqueued >= limit) {
                    if let Some(w) = t.queue.pop_front() {
                        out.push(w.ticket);
                        c.queued -= 1;
                    }
                }
            }
        }
        out
    }
}

pub mod runtime;

#[cfg(test)]
mod tests;
