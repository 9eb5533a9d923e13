//! program-router: an OpenAI-compatible router over vLLM data-parallel ranks.
//!
//! Layers: [`config`] (typed config, CLI, file watch) → [`server`] (HTTP front) → [`policies`]
//! (request-level placement) → [`proxy`] (forwarding, retries, streaming relay) over
//! [`workers`] (targets, health, breakers), with [`observe`] for metrics in both directions.
#![forbid(unsafe_code)]

pub mod applied;
pub mod auth;
pub mod calibrate;
pub mod cli;
pub mod config;
pub mod error;
pub mod fair;
#[doc(hidden)]
pub mod fuzz;
pub mod hash;
pub mod limit;
pub mod net;
pub mod observe;
pub mod peers;
pub mod policies;
pub mod program;
pub mod proxy;
pub mod run;
pub mod server;
pub mod state;
pub mod workers;
