//! Program scheduling: requests that carry Program identity are grouped into Programs, admitted by
//! capacity, retained in a RequestPool when a rank is full, and keep their KV across short tool
//! calls through Progress-TTL (spec: the reference router's `program_scheduling.md`).
//!
//! The core is pure — [`scheduler::Scheduler`] takes events with an explicit `now` and returns
//! decisions ([`identity`], [`cost`], [`window`], [`diagnostics`] alike); [`runtime`] drives it
//! with time, locks and waiting requests, and [`metrics`] holds its series.

pub mod cost;
pub mod diagnostics;
pub mod identity;
pub mod metrics;
pub mod runtime;
pub mod scheduler;
pub mod window;

#[cfg(test)]
mod tests;
