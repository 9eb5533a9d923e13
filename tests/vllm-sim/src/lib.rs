//! vllm-sim: a simulated vLLM OpenAI-compatible server for scheduling work without a GPU.
//!
//! The crate has two halves that share one engine model:
//! * [`engine`] — a pure, explicitly clocked model of one DP rank (prefix-cached KV blocks with LRU
//!   eviction, continuous batching, chunked prefill, preemption, calibrated step time);
//! * [`server`] — a hyper HTTP server that drives one engine per DP rank in real time × scale and
//!   speaks vLLM's OpenAI API, `/metrics` and DP-rank header.
#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod kv;
pub mod server;
pub mod timing;
pub mod tokenizer;
