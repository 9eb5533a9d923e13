//! Deterministic engine tests in virtual time.

use super::*;

fn params(num_gpu_blocks: usize) -> EngineParams {
    EngineParams {
        num_gpu_blocks,
        max_model_len: 1024.min(num_gpu_blocks * 16),
        ..Default::default()
    }
}

fn req(prompt: Vec<u32>, max_tokens: u32) -> SeqRequest {
    SeqRequest {
        prompt,
        max_tokens,
        priority: 0,
        output_seed: 7,
        prefix_hashes: Vec::new(),
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| seed.wrapping_mul(1_000_003).wrapping_add(i))
        .collect()
}

/// Runs until idle; returns every event.
fn drain(e: &mut Engine) -> Vec<EngineEvent> {
    let mut ev = Vec::new();
    while let Some(t) = e.next_event_time() {
        e.advance(t, &mut ev);
    }
    ev
}

fn outcome_of(ev: &[EngineEvent], want: SeqId) -> Outcome {
    ev.iter()
        .find_map(|e| match e {
            EngineEvent::Finished { id, outcome, .. } if *id == want => Some(*outcome),
            _ => None,
        })
        .expect("finished event")
}

#[test]
fn same_prompt_twice_reuses_its_full_blocks() {
    let mut e = Engine::new(params(64));
    let p = prompt(1, 100); // 6 full blocks + 4 tokens
    let a = e.submit(req(p.clone(), 3), 0.0);
    let ev = drain(&mut e);
    assert_eq!(outcome_of(&ev, a).cached_tokens, 0);
    let b = e.submit(req(p, 3), e.clock());
    let ev = drain(&mut e);
    let o = outcome_of(&ev, b);
    assert_eq!(o.cached_tokens, 96);
    assert_eq!((o.prompt_tokens, o.completion_tokens), (100, 3));
    assert_eq!(e.stats().prompt_tokens, 200);
    assert_eq!(e.stats().prompt_tokens_cached, 96);
    assert_eq!(e.stats().generation_tokens, 6);
}

#[test]
fn a_block_aligned_prompt_recomputes_its_last_block() {
    // As vLLM: at least the last prompt token is computed, so a 64-token prompt hits 48.
    let mut e = Engine::new(params(64));
    let p = prompt(2, 64);
    e.submit(req(p.clone(), 1), 0.0);
    drain(&mut e);
    let b = e.submit(req(p, 1), e.clock());
    assert_eq!(outcome_of(&drain(&mut e), b).cached_tokens, 48);
}

#[test]
fn generated_tokens_are_cached_for_the_next_turn() {
    let mut e = Engine::new(params(64));
    let p = prompt(3, 40);
    let a = e.submit(req(p.clone(), 24), 0.0);
    let ev = drain(&mut e);
    let mut next = p;
    next.extend(ev.iter().filter_map(|x| match x {
        EngineEvent::Token { id, token, .. } if *id == a => Some(*token),
        _ => None,
    }));
    next.extend(prompt(4, 30));
    let b = e.submit(req(next, 1), e.clock());
    // 40 prompt + 24 output = 64 tokens, of which the first 63 had KV computed: 3 full blocks.
    assert_eq!(outcome_of(&drain(&mut e), b).cached_tokens, 48);
}

#[test]
fn eviction_is_lru_and_keeps_prefixes_longest() {
    // 8 blocks of 16 tokens. A (3 blocks) then B (3 blocks) finish; C needs 4 fresh blocks and
    // evicts: the 2 never-used blocks first, then A's tail blocks (A was freed before B).
    let mut e = Engine::new(params(8));
    let pa = prompt(10, 48);
    let pb = prompt(11, 48);
    e.submit(req(pa.clone(), 1), 0.0);
    drain(&mut e);
    e.submit(req(pb.clone(), 1), e.clock());
    drain(&mut e);
    e.submit(req(prompt(12, 64), 1), e.clock());
    drain(&mut e);
    let cached = |p: &[u32]| {
        let mut h = Vec::new();
        crate::kv::extend_block_hashes(p, 16, &mut h);
        h.iter().map(|x| e.pool().is_cached(*x)).collect::<Vec<_>>()
    };
    // A (freed first) lost its two tail blocks; its first block and all of B survive.
    assert_eq!(cached(&pa), vec![true, false, false]);
    assert_eq!(cached(&pb), vec![true, true, true]);
    assert_eq!(e.pool().evictions(), 2);
    let a = e.submit(req(pa, 1), e.clock());
    assert_eq!(outcome_of(&drain(&mut e), a).cached_tokens, 16);
}

#[test]
fn ranks_do_not_share_cache() {
    let mut r0 = Engine::new(params(64));
    let mut r1 = Engine::new(params(64));
    let p = prompt(5, 80);
    r0.submit(req(p.clone(), 1), 0.0);
    drain(&mut r0);
    let b = r1.submit(req(p, 1), 0.0);
    assert_eq!(outcome_of(&drain(&mut r1), b).cached_tokens, 0);
}

#[test]
fn overload_preempts_and_every_request_still_finishes() {
    // 6 blocks = 96 tokens; four requests of 20 prompt + 40 output tokens cannot all fit.
    let mut e = Engine::new(EngineParams {
        num_gpu_blocks: 6,
        max_model_len: 96,
        ..Default::default()
    });
    let ids: Vec<_> = (0..4)
        .map(|i| e.submit(req(prompt(20 + i, 20), 40), 0.0))
        .collect();
    let ev = drain(&mut e);
    for id in ids {
        assert_eq!(outcome_of(&ev, id).completion_tokens, 40);
    }
    assert!(
        e.stats().preemptions > 0,
        "expected preemption under overload"
    );
    assert_eq!(e.stats().generation_tokens, 160);
    assert_eq!(e.pool().num_free(), 6);
    assert!(!e.is_busy());
}

#[test]
fn virtual_ttft_equals_the_cold_prefill_formula() {
    let mut e = Engine::new(EngineParams {
        max_model_len: 16384,
        ..Default::default()
    });
    let a = e.submit(req(prompt(30, 5000), 3), 1.0);
    let ev = drain(&mut e);
    let o = outcome_of(&ev, a);
    let t = TimingModel::default();
    let ttft = o.first_token.expect("first token") - o.arrival;
    assert!(
        (ttft - t.cold_prefill_seconds(5000)).abs() < 1e-9,
        "ttft {ttft}"
    );
    // Then two decode steps of batch 1 with context 5001 and 5002 tokens.
    let e2e = o.finished - o.arrival;
    let want = ttft + t.decode_step_seconds(1, 5001) + t.decode_step_seconds(1, 5002);
    assert!((e2e - want).abs() < 1e-9, "e2e {e2e} want {want}");
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let mut e = Engine::new(EngineParams {
        max_num_batched_tokens: 512,
        max_model_len: 4096,
        ..Default::default()
    });
    let a = e.submit(req(prompt(31, 2000), 1), 0.0);
    let ev = drain(&mut e);
    assert_eq!(e.stats().steps, 4, "2000 tokens in chunks of 512");
    let o = outcome_of(&ev, a);
    let ttft = o.first_token.expect("first") - o.arrival;
    assert!((ttft - TimingModel::default().cold_prefill_seconds(2000)).abs() < 1e-9);
}

#[test]
fn max_num_seqs_bounds_the_batch() {
    let mut e = Engine::new(EngineParams {
        max_num_seqs: 2,
        ..params(64)
    });
    for i in 0..5 {
        e.submit(req(prompt(40 + i, 8), 4), 0.0);
    }
    let mut ev = Vec::new();
    e.advance(0.0, &mut ev);
    assert_eq!(e.load().running, 2);
    assert_eq!(e.load().waiting, 3);
    drain(&mut e);
    assert_eq!(e.stats().finished_length, 5);
}

#[test]
fn priority_policy_runs_lower_values_first() {
    let mut e = Engine::new(EngineParams {
        max_num_seqs: 1,
        policy: SchedulingPolicy::Priority,
        ..params(64)
    });
    let low = e.submit(
        SeqRequest {
            priority: 5,
            ..req(prompt(50, 8), 1)
        },
        0.0,
    );
    let high = e.submit(
        SeqRequest {
            priority: -1,
            ..req(prompt(51, 8), 1)
        },
        0.0,
    );
    let ev = drain(&mut e);
    assert!(outcome_of(&ev, high).finished < outcome_of(&ev, low).finished);
}

#[test]
fn fcfs_ignores_priority() {
    let mut e = Engine::new(EngineParams {
        max_num_seqs: 1,
        ..params(64)
    });
    let first = e.submit(
        SeqRequest {
            priority: 5,
            ..req(prompt(52, 8), 1)
        },
        0.0,
    );
    let second = e.submit(
        SeqRequest {
            priority: -1,
            ..req(prompt(53, 8), 1)
        },
        0.0,
    );
    let ev = drain(&mut e);
    assert!(outcome_of(&ev, first).finished < outcome_of(&ev, second).finished);
}

#[test]
fn abort_frees_blocks_mid_step() {
    let mut e = Engine::new(params(64));
    let a = e.submit(req(prompt(60, 100), 50), 0.0);
    let mut ev = Vec::new();
    e.advance(0.0, &mut ev); // the prefill step is now in flight
    assert!(e.pool().num_free() < 64);
    let o = e.abort(a, 0.01).expect("known id");
    assert_eq!(o.reason, FinishReason::Abort);
    assert_eq!(e.pool().num_free(), 64);
    drain(&mut e);
    assert!(e.abort(a, 1.0).is_none());
    assert!(!e.is_busy());
}

#[test]
fn requests_beyond_max_model_len_are_refused() {
    let e = params(64);
    assert!(
        e.check(1000, 100)
            .unwrap_err()
            .contains("maximum context length is 1024")
    );
    assert!(e.check(0, 1).is_err());
    assert!(e.check(1000, 24).is_ok());
}

#[test]
fn zero_timing_completes_within_one_advance() {
    let mut e = Engine::new(EngineParams {
        timing: TimingModel::zero(),
        ..params(64)
    });
    let ids: Vec<_> = (0..10)
        .map(|i| e.submit(req(prompt(70 + i, 10), 5), 0.0))
        .collect();
    let mut ev = Vec::new();
    e.advance(0.0, &mut ev);
    for id in ids {
        assert_eq!(outcome_of(&ev, id).completion_tokens, 5);
    }
}

#[test]
fn same_inputs_give_same_events() {
    let run = || {
        let mut e = Engine::new(params(16));
        for i in 0..6 {
            e.submit(req(prompt(80 + i % 2, 60), 20), f64::from(i) * 0.01);
        }
        drain(&mut e)
    };
    assert_eq!(run(), run());
}

/// What a discrete-event driver sees: each finish with the time the driver woke for it, the
/// load at probe times, the engine's counters, and how often the driver woke.
#[derive(Debug, PartialEq)]
struct Replay {
    finishes: Vec<(f64, SeqId, Outcome, Vec<u32>)>,
    loads: Vec<Load>,
    steps: u64,
    preemptions: u64,
    generation_tokens: u64,
    cached: u64,
    wakes: usize,
}

/// Drives an engine the way the virtual-time harness does: wake at the next arrival, probe or
/// engine event, whichever is first; submit arrivals due; read the load at probes.
fn replay(token_events: bool, arrivals: &[(f64, SeqRequest)], probes: &[f64]) -> Replay {
    let mut e = Engine::new(params(48));
    e.set_token_events(token_events);
    let mut r = Replay {
        finishes: Vec::new(),
        loads: Vec::new(),
        steps: 0,
        preemptions: 0,
        generation_tokens: 0,
        cached: 0,
        wakes: 0,
    };
    let (mut a, mut p) = (0, 0);
    let mut ev = Vec::new();
    loop {
        let now = [
            arrivals.get(a).map(|x| x.0),
            probes.get(p).copied(),
            e.next_event_time(),
        ]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
        if now.is_infinite() {
            break;
        }
        r.wakes += 1;
        e.advance(now, &mut ev);
        for x in ev.drain(..) {
            if let EngineEvent::Finished {
                id,
                outcome,
                tokens,
            } = x
            {
                r.finishes.push((now, id, outcome, tokens));
            }
        }
        while a < arrivals.len() && arrivals[a].0 <= now {
            e.submit(arrivals[a].1.clone(), now);
            a += 1;
        }
        while p < probes.len() && probes[p] <= now {
            e.sync(now);
            r.loads.push(e.load());
            p += 1;
        }
    }
    let s = e.stats();
    (r.steps, r.preemptions, r.generation_tokens, r.cached) = (
        s.steps,
        s.preemptions,
        s.generation_tokens,
        s.prompt_tokens_cached,
    );
    r
}

#[test]
fn decode_runs_without_token_events_match_step_by_step_exactly() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    for seed in 0..20u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut t = 0.0;
        let arrivals: Vec<(f64, SeqRequest)> = (0..30)
            .map(|i| {
                t += rng.random_range(0.0..0.3);
                // Few distinct prompt heads, so prefixes are shared and reused.
                let head = prompt(rng.random_range(0..4), rng.random_range(16..160));
                let mut p = head;
                p.extend(prompt(1000 + i, rng.random_range(1..40)));
                (
                    t,
                    SeqRequest {
                        output_seed: u64::from(i),
                        ..req(p, rng.random_range(1..120))
                    },
                )
            })
            .collect();
        let probes: Vec<f64> = (1..60).map(|k| f64::from(k) * 0.17).collect();
        let lazy = replay(false, &arrivals, &probes);
        let stepwise = replay(true, &arrivals, &probes);
        assert_eq!(lazy.finishes.len(), 30, "seed {seed}");
        for (now, _, o, tokens) in &lazy.finishes {
            // The driver woke exactly when the finishing step ended.
            assert_eq!(*now, o.finished, "seed {seed}");
            assert_eq!(tokens.len(), o.prompt_tokens + o.completion_tokens as usize);
        }
        assert!(
            lazy.wakes < stepwise.wakes,
            "seed {seed}: {} wakes vs {}",
            lazy.wakes,
            stepwise.wakes
        );
        assert_eq!(
            Replay { wakes: 0, ..lazy },
            Replay {
                wakes: 0,
                ..stepwise
            },
            "seed {seed}"
        );
    }
}

#[test]
fn prefix_hashes_given_by_the_caller_change_nothing() {
    let run = |given: bool| {
        let mut e = Engine::new(params(64));
        let p = prompt(90, 150);
        let mut hashes = Vec::new();
        crate::kv::extend_block_hashes(&p, 16, &mut hashes);
        hashes.truncate(5); // any leading part will do
        e.submit(req(p.clone(), 4), 0.0);
        let ev = drain(&mut e);
        let b = e.submit(
            SeqRequest {
                prefix_hashes: if given { hashes } else { Vec::new() },
                ..req(p, 4)
            },
            e.clock(),
        );
        let ev2 = drain(&mut e);
        (ev, outcome_of(&ev2, b), e.stats().prompt_tokens_cached)
    };
    let (with, without) = (run(true), run(false));
    assert_eq!(with, without);
    assert_eq!(with.1.cached_tokens, 144);
}

#[test]
fn free_retention_keeps_an_evicted_prefix_a_hit_and_a_real_engine_does_not() {
    // 16 blocks: a 100-token prompt (7 blocks), then a 240-token one that needs every block.
    let run = |free_retention: bool| {
        let mut e = Engine::new(EngineParams {
            free_retention,
            ..params(16)
        });
        let p = prompt(1, 100);
        e.submit(req(p.clone(), 3), 0.0);
        drain(&mut e);
        e.submit(req(prompt(2, 240), 3), e.clock());
        drain(&mut e);
        assert!(
            e.pool().evictions() > 0,
            "the first prompt's blocks were evicted"
        );
        let again = e.submit(req(p, 3), e.clock());
        let ev = drain(&mut e);
        // Room for the running request is still needed: the pool holds at most 16 blocks.
        assert!(e.pool().num_blocks() == 16);
        outcome_of(&ev, again).cached_tokens
    };
    assert_eq!(run(false), 0, "evicted: recomputed");
    assert_eq!(run(true), 96, "every full block it ever computed is a hit");
}

#[test]
fn an_end_hint_evicts_the_ended_programs_blocks_before_an_older_paused_ones() {
    // 16 blocks: a paused Program's 96 tokens (6 blocks) freed first, an ended one's after;
    // then a new 96-token prompt needs 7 blocks, so something cached must go.
    let run = |end_hint: bool| {
        let mut e = Engine::new(EngineParams {
            end_hint,
            ..params(16)
        });
        let paused = prompt(1, 96);
        e.submit(req(paused.clone(), 3), 0.0);
        drain(&mut e);
        let ended = prompt(2, 96);
        e.submit(req(ended.clone(), 3), e.clock());
        drain(&mut e);
        let mut hashes = Vec::new();
        crate::kv::extend_block_hashes(&ended, 16, &mut hashes);
        e.program_ended(&hashes);
        e.submit(req(prompt(3, 96), 3), e.clock());
        drain(&mut e);
        let back = e.submit(req(paused, 3), e.clock());
        outcome_of(&drain(&mut e), back).cached_tokens
    };
    assert!(
        run(false) < 80,
        "LRU: the paused Program's older prefix went first"
    );
    assert_eq!(
        run(true),
        80,
        "hinted: the ended Program's blocks went instead"
    );
}
