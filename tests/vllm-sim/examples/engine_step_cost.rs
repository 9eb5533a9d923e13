//! Measures the engine model's own cost: wall-clock time per simulated step with 256 sequences
//! decoding, and simulated 1-token requests per second with zero step time.
//!
//! `cargo run --release -p vllm-sim --example engine_step_cost`

use std::time::Instant;

use vllm_sim::engine::{Engine, EngineParams, SeqRequest};
use vllm_sim::timing::TimingModel;

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| seed.wrapping_mul(2_654_435_761).wrapping_add(i))
        .collect()
}

fn main() {
    // 256 sequences of 1,000 prompt tokens decoding 2,000 tokens each.
    let params = EngineParams {
        num_gpu_blocks: 65_536,
        max_num_seqs: 256,
        ..Default::default()
    };
    let mut e = Engine::new(params);
    for s in 0..256 {
        e.submit(
            SeqRequest {
                prompt: prompt(s, 1000),
                max_tokens: 2000,
                priority: 0,
                output_seed: u64::from(s),
                prefix_hashes: Vec::new(),
            },
            0.0,
        );
    }
    let mut ev = Vec::new();
    // Prefill (chunked: 8,192 tokens a step) until every sequence decodes.
    while e.load().waiting > 0 || e.stats().steps < 40 {
        let t = e.next_event_time().expect("busy");
        e.advance(t, &mut ev);
        ev.clear();
    }
    assert_eq!(e.load().running, 256);
    let steps = 1000;
    let start = Instant::now();
    for _ in 0..steps {
        let t = e.next_event_time().expect("busy");
        e.advance(t, &mut ev);
        ev.clear();
    }
    let per_step = start.elapsed().as_secs_f64() / f64::from(steps);
    assert_eq!(e.load().running, 256, "still decoding");
    println!(
        "engine step with 256 running sequences: {:.1} µs (wall) per step, {:.0} ns per sequence-token",
        per_step * 1e6,
        per_step * 1e9 / 256.0
    );

    // 1-token requests with zero step time, 64 at a time.
    let params = EngineParams {
        timing: TimingModel::zero(),
        ..Default::default()
    };
    let mut e = Engine::new(params);
    let n = 200_000u32;
    let start = Instant::now();
    let mut done = 0u32;
    while done < n {
        for i in 0..64 {
            e.submit(
                SeqRequest {
                    prompt: prompt(done + i, 32),
                    max_tokens: 1,
                    priority: 0,
                    output_seed: 1,
                    prefix_hashes: Vec::new(),
                },
                0.0,
            );
        }
        e.advance(0.0, &mut ev);
        ev.clear();
        done += 64;
    }
    let rate = f64::from(done) / start.elapsed().as_secs_f64();
    println!("engine alone, 1-token requests (32-token prompts, batches of 64): {rate:.0} req/s");
}
