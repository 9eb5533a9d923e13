//! Observation: the router's own metrics and what it reads from backends' `/metrics`.

pub mod access;
pub mod backlog;
pub mod log;
pub mod log_context;
pub mod log_filter;
pub mod log_format;
pub mod log_writer;
pub mod metrics;
pub mod scrape;
pub mod sharded;
pub mod summary;
pub mod trace;
