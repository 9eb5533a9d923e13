//! Observation: the router's own metrics and what it reads from backends' `/metrics`.

pub mod metrics;
pub mod scrape;
pub mod summary;
