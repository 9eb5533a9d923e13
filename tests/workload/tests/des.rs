//! The discrete-event harness on a tiny workload: deterministic, comparable across modes, and
//! every Program accounted for. No timing assertions (those are benchmarks).

use progbench::des::{Clients, Mode, run, run_with};
use progbench::workload::{Preset, generate};
use program_router::config::ProgramSchedulingConfig;
use vllm_sim::engine::EngineParams;

fn engine() -> EngineParams {
    EngineParams {
        num_gpu_blocks: 2048,
        max_model_len: 32768,
        ..Default::default()
    }
}

#[test]
fn modes_serve_the_same_work_and_replays_are_deterministic() {
    let turns = generate(Preset::SweAgent, 16, 0.2, 3);
    let hash = run(&turns, 2, &engine(), &Mode::ConsistentHash);
    let prog = run(&turns, 2, &engine(), &Mode::Program(Box::default()));
    for r in [&hash, &prog] {
        assert_eq!(r.programs, 16);
        assert_eq!(r.programs_completed + r.programs_truncated, 16, "{r:?}");
        assert!(r.prompt_tokens > 0 && r.cached_tokens <= r.prompt_tokens);
    }
    assert_eq!(prog.queue_timeouts, 0);
    assert_eq!(hash.requests, prog.requests, "same requests served");
    assert_eq!(hash.output_tokens, prog.output_tokens, "same output tokens");
    assert!(prog.scheduler_events > 0);
    let again = run(&turns, 2, &engine(), &Mode::Program(Box::default()));
    assert_eq!(
        (again.cached_tokens, again.mean_jct_seconds.to_bits()),
        (prog.cached_tokens, prog.mean_jct_seconds.to_bits())
    );
}

#[test]
fn binding_only_places_like_consistent_hashing_and_never_queues() {
    let turns = generate(Preset::Chat, 12, 0.5, 4);
    let cfg = ProgramSchedulingConfig {
        binding_only: true,
        ..Default::default()
    };
    let r = run(&turns, 3, &engine(), &Mode::Program(Box::new(cfg)));
    assert_eq!(r.mean_queue_wait_seconds, 0.0);
    assert_eq!(r.programs_completed + r.programs_truncated, 12);
}

#[test]
fn kv_demand_says_when_live_contexts_outgrow_the_cluster() {
    let turns = generate(Preset::SweAgent, 16, 0.2, 3);
    let big = EngineParams {
        num_gpu_blocks: 65536,
        ..engine()
    };
    let roomy = run(&turns, 2, &big, &Mode::ConsistentHash);
    let tight = run(&turns, 2, &engine(), &Mode::ConsistentHash);
    assert!(
        roomy.kv_demand_p90 > 0.0 && roomy.kv_demand_p90 < 1.0,
        "{roomy:?}"
    );
    assert_eq!(roomy.kv_demand_over_capacity, 0.0);
    // The same Programs over 32x less KV: demand scales with it and outgrows it at times.
    let ratio = tight.kv_demand_p90 / roomy.kv_demand_p90;
    assert!(ratio > 8.0, "{ratio}");
    assert!(tight.kv_demand_over_capacity > 0.0 && tight.kv_demand_over_capacity <= 1.0);
    // Where reusable tokens were lost: with room, at most block rounding (the last output
    // token's KV is never computed, so a context ending on a block boundary loses that block);
    // without, far more. Hashing never moves a Program; the losses are part of the uncached
    // prompt tokens.
    let total = |m: &progbench::des::MissedHit| {
        m.moved + m.gap_under_2s + m.gap_2_to_10s + m.gap_10s_or_more
    };
    assert!(
        total(&roomy.missed) <= 16 * roomy.requests,
        "{:?}",
        roomy.missed
    );
    assert!(total(&tight.missed) > 100 * total(&roomy.missed).max(1));
    assert_eq!(tight.missed.moved, 0);
    assert!(total(&tight.missed) <= tight.prompt_tokens - tight.cached_tokens);
    // The run itself is one way to evict on its own timeline, so the bound on that timeline
    // (pooled, Belady) is at least its hit; LRU without hints at most Belady's.
    for r in [&roomy, &tight] {
        let b = &r.pooled_on_run;
        assert!(
            b.token_hit + 1e-9 >= r.token_hit_rate,
            "{b:?} vs {}",
            r.token_hit_rate
        );
        assert!(b.lru_token_hit <= b.token_hit + 1e-9, "{b:?}");
    }
}

#[test]
fn a_client_retention_ttl_holds_paused_programs_and_bad_values_are_refused() {
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let err = Clients::with_retention_ttl(Some(bad)).expect_err("refused");
        assert!(err.contains("--client-retention-ttl"), "{err}");
    }
    let turns = generate(Preset::SweAgent, 16, 0.2, 3);
    let mode = Mode::Program(Box::default());
    let auto = run(&turns, 2, &engine(), &mode);
    let none = Clients::with_retention_ttl(Some(0.0)).expect("valid");
    let zero = run_with(&turns, 2, &engine(), &mode, &none);
    // A client TTL of 0 pauses every Program at once instead of holding it for the automatic
    // TTL (active here: the interval window fills within the run); the work served is the same.
    assert_eq!(zero.requests, auto.requests);
    assert_eq!(zero.output_tokens, auto.output_tokens);
    assert_ne!(
        (zero.cached_tokens, zero.mean_jct_seconds.to_bits()),
        (auto.cached_tokens, auto.mean_jct_seconds.to_bits()),
        "the client's TTL replaced the automatic one"
    );
}

#[test]
fn a_clairvoyant_client_holds_a_context_only_through_gaps_shorter_than_its_re_prefill() {
    use progbench::des::clairvoyant_ttl;
    use program_router::config::program::PrefillCostModel;
    use program_router::program::cost::prefill_seconds;
    let model = PrefillCostModel::default();
    let (context, capacity) = (4_000, 40_000);
    // Held, 4K tokens take a tenth of the rank for the gap: break-even at 10× the re-prefill.
    let even = prefill_seconds(&model, context as u64) * 10.0;
    let short = clairvoyant_ttl(context, even * 0.9, capacity, &model);
    assert!(short >= even * 0.9, "held through a short gap: {short}");
    assert_eq!(clairvoyant_ttl(context, even * 1.1, capacity, &model), 0.0);
    // On a rank four times as large the same context is held through the longer gap.
    assert!(clairvoyant_ttl(context, even * 1.1, capacity * 4, &model) >= even * 1.1);

    let turns = generate(Preset::SweAgent, 16, 0.2, 3);
    let mode = Mode::Program(Box::default());
    let knowing = Clients {
        clairvoyant: true,
        ..Clients::default()
    };
    let auto = run(&turns, 2, &engine(), &mode);
    let told = run_with(&turns, 2, &engine(), &mode, &knowing);
    assert_eq!(told.requests, auto.requests);
    assert_ne!(
        (told.cached_tokens, told.mean_jct_seconds.to_bits()),
        (auto.cached_tokens, auto.mean_jct_seconds.to_bits()),
        "the clairvoyant TTL replaced the automatic one"
    );
}
