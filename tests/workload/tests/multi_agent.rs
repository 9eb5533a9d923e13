//! Subagents: the generator's parent/child trees, and both drivers (virtual time and HTTP)
//! honouring `spawned_after_step` and `blocks_parent`. No timing assertions beyond ordering.

use std::time::Duration;

use progbench::des::{Mode, run};
use progbench::replay::{ContextMode, Endpoints, ReplayConfig, replay};
use progbench::workload::{Preset, Turn, from_jsonl, generate, programs, to_jsonl};
use vllm_sim::engine::EngineParams;

fn turn(program: &str, step: u32, gap: f64, parent: Option<(&str, u32, bool)>) -> Turn {
    Turn {
        program_id: program.into(),
        task_id: "t".into(),
        step,
        program_arrival: 0.0,
        system_prompt: 0,
        system_tokens: 64,
        append_tokens: 32,
        output_tokens: 4,
        gap_after: gap,
        tool: None,
        parent_program_id: parent.map(|p| p.0.to_string()),
        spawned_after_step: parent.map(|p| p.1),
        blocks_parent: parent.is_some_and(|p| p.2),
    }
}

/// A lead with two turns (1 s apart) that spawns, after its first turn, a subagent running
/// three turns 5 s apart.
fn lead_and_subagent(blocks: bool) -> Vec<Turn> {
    let kid = Some(("lead", 0, blocks));
    vec![
        turn("lead", 0, 1.0, None),
        turn("lead", 1, 0.0, None),
        turn("lead-s0", 0, 5.0, kid),
        turn("lead-s0", 1, 5.0, kid),
        turn("lead-s0", 2, 0.0, kid),
    ]
}

#[test]
fn the_multi_agent_preset_builds_trees_that_survive_the_file_format() {
    let turns = generate(Preset::MultiAgent, 40, 0.1, 11);
    let progs = programs(&turns);
    let ids: std::collections::HashSet<&str> =
        progs.iter().map(|p| p[0].program_id.as_str()).collect();
    let kids: Vec<&Vec<Turn>> = progs
        .iter()
        .filter(|p| p[0].parent_program_id.is_some())
        .collect();
    assert!(kids.len() >= 10, "subagents generated: {}", kids.len());
    let blocking = kids.iter().filter(|k| k[0].blocks_parent).count();
    assert!(blocking > kids.len() / 2 && blocking < kids.len());
    for k in &kids {
        let parent = k[0].parent_program_id.as_deref().expect("parent");
        assert!(ids.contains(parent), "{parent} exists");
        let lead = progs
            .iter()
            .find(|p| p[0].program_id == parent)
            .expect("lead");
        let after = k[0].spawned_after_step.expect("spawn step");
        assert!(
            after + 1 < lead.len() as u32,
            "spawned before the lead's last turn"
        );
        assert_eq!(
            k[0].system_prompt, lead[0].system_prompt,
            "shared system prompt"
        );
    }
    assert_eq!(from_jsonl(&to_jsonl(&turns)).expect("parses"), turns);
    // Root Programs of other presets carry none of the new fields in the file.
    assert!(!to_jsonl(&generate(Preset::SweAgent, 2, 1.0, 1)).contains("parent_program_id"));
}

#[test]
fn virtual_time_waits_for_blocking_subagents_only() {
    let engine = EngineParams::default();
    for blocks in [true, false] {
        let turns = lead_and_subagent(blocks);
        for mode in [Mode::ConsistentHash, Mode::Program(Box::default())] {
            let r = run(&turns, 2, &engine, &mode);
            assert_eq!(r.programs, 2);
            assert_eq!(r.programs_completed, 2, "{r:?}");
            assert_eq!(r.requests, 5);
            let (lead, sub) = (r.series.jcts.iter().cloned().fold(0.0, f64::max), {
                r.series.jcts.iter().cloned().fold(f64::MAX, f64::min)
            });
            if blocks {
                // The lead's second turn waits for the subagent's 10 s of tool time.
                assert!(lead > 10.0 && sub > 10.0, "{:?}", r.series.jcts);
            } else {
                // The lead finishes after its own 1 s gap; the subagent runs on.
                assert!(sub < 5.0 && lead > 10.0, "{:?}", r.series.jcts);
            }
        }
    }
}

/// Replay settings for the HTTP tests: 10 simulated seconds per wall second, 30 s at most.
fn config(url: String, max_model_len: usize) -> ReplayConfig {
    ReplayConfig {
        endpoints: Endpoints::one(url),
        model: "sim-model".into(),
        context: ContextMode::String,
        time_scale: 10.0,
        max_model_len,
        limit: Duration::from_secs(30),
        stream: false,
        max_requests: None,
        api_key: None,
        clairvoyant_capacity: None,
    }
}

/// A simulator on a free loopback port with its defaults.
async fn simulator() -> vllm_sim::server::Spawned {
    vllm_sim::server::spawn_with_flags(&[], Duration::from_secs(5))
        .await
        .expect("simulator")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_replay_waits_for_blocking_subagents() {
    let sim = simulator().await;
    for blocks in [true, false] {
        let report = replay(
            &lead_and_subagent(blocks),
            // 10 simulated seconds per wall second: the subagent's gaps take 1 s.
            config(sim.base(), 32768),
        )
        .await;
        assert_eq!(report.errors, 0);
        assert_eq!(report.requests.len(), 5);
        let jct = |p: &str| {
            report
                .jct
                .iter()
                .find(|(id, _)| id == p)
                .map(|x| x.1)
                .expect("finished")
        };
        if blocks {
            assert!(jct("lead") > jct("lead-s0"), "{:?}", report.jct);
        } else {
            assert!(jct("lead") < jct("lead-s0"), "{:?}", report.jct);
        }
    }
}

/// A lead whose second turn outgrows a 1,000-token model, and a subagent due after that turn.
fn cut_lead_and_orphan() -> Vec<Turn> {
    let mut long = turn("lead", 1, 0.0, None);
    long.append_tokens = 2_000;
    vec![
        turn("lead", 0, 0.5, None),
        long,
        turn("lead-s1", 0, 0.0, Some(("lead", 1, true))),
    ]
}

#[test]
fn virtual_time_never_starts_a_subagent_whose_parent_stopped_first() {
    let engine = EngineParams {
        max_model_len: 1_000,
        ..Default::default()
    };
    let r = run(&cut_lead_and_orphan(), 1, &engine, &Mode::ConsistentHash);
    assert_eq!(r.requests, 1, "only the lead's first turn runs");
    assert_eq!(r.programs_truncated, 2, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_replay_never_starts_a_subagent_whose_parent_stopped_first() {
    let sim = simulator().await;
    let report = replay(&cut_lead_and_orphan(), config(sim.base(), 1_000)).await;
    assert_eq!(report.errors, 0);
    assert_eq!(report.requests.len(), 1, "{:?}", report.requests);
    assert_eq!(report.truncated, 2);
    assert_eq!(report.completed, 0);
    // The lead ends when its second turn would have been sent (after its 0.5 s gap), as `sim`
    // and the oracle count it; the subagent never started and has no JCT.
    assert_eq!(report.jct.len(), 1, "{:?}", report.jct);
    assert_eq!(report.jct[0].0, "lead");
    assert!(report.jct[0].1 >= 0.5, "{:?}", report.jct);
}
