//! Scheduler behaviour, one spec rule per test, grouped by concern, plus a property test over
//! random event sequences. This file holds the helpers the groups share.

use super::identity::Identity;
use super::scheduler::*;
use crate::config::ProgramSchedulingConfig;
use crate::config::program::{ActingTtlCost, BindingStrategy, PrefillCostModel, ResumeOrder};

mod admission;
mod answers;
mod binding;
mod bounds;
mod changes;
mod cross_rank;
mod hold_free;
mod kinds;
mod lifecycle;
mod overcommit;
mod pool;
mod properties;
mod tools;

fn cfg() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(1000),
        decode_buffer_tokens: 0,
        binding_strategy: BindingStrategy::ProgramRoundRobin,
        // Rank-local unless a test is about cross-rank resume.
        global_queue: false,
        ..Default::default()
    }
}

fn sched(c: ProgramSchedulingConfig, ranks: usize) -> Scheduler {
    Scheduler::new(c, (0..ranks).map(|i| format!("r{i}")).collect())
}

fn arrival(ticket: Ticket, program: &str, prompt: u64) -> Arrival {
    Arrival {
        ticket,
        model: "m".into(),
        identity: Identity {
            program_id: program.into(),
            expected_resume: true,
            ..Default::default()
        },
        prompt_tokens: prompt,
        tenant: None,
        prefix: Vec::new(),
        lead: None,
        system: None,
    }
}

fn with(mut a: Arrival, f: impl FnOnce(&mut Identity)) -> Arrival {
    f(&mut a.identity);
    a
}

/// `a` whose prompt starts with the shared prefix (system prompt) keyed `lead`.
fn led(mut a: Arrival, lead: u64) -> Arrival {
    a.lead = Some(lead);
    a.system = Some(lead);
    a
}

/// `a` asking to keep its Program's KV `seconds` after it completes.
fn with_ttl(a: Arrival, seconds: f64) -> Arrival {
    with(a, |i| i.kv_retention_ttl_seconds = Some(seconds))
}

fn usage(prompt: u64, completion: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: 0,
    })
}

/// One rank on which Program "a" (900 tokens) holds its place through a 100 s tool call.
fn held_by_acting(c: ProgramSchedulingConfig) -> Scheduler {
    let mut s = sched(c, 1);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 900), 100.0));
    s.on_complete(0.5, 1, usage(900, 10));
    s
}

fn dispatched(d: &[Decision]) -> Vec<Ticket> {
    d.iter()
        .filter_map(|x| {
            if let Decision::Dispatch { ticket, .. } = x {
                Some(*ticket)
            } else {
                None
            }
        })
        .collect()
}

fn rank_of(d: &[Decision], ticket: Ticket) -> Option<Rank> {
    d.iter().find_map(|x| match x {
        Decision::Dispatch { ticket: t, rank } if *t == ticket => Some(*rank),
        _ => None,
    })
}

fn find<'a>(s: &'a Scheduler, program: &str) -> &'a Program {
    s.programs
        .iter()
        .flatten()
        .find(|p| p.key.1 == program)
        .expect("program exists")
}

fn dispatch_rank(d: &[Decision], t: Ticket) -> Option<Rank> {
    d.iter().find_map(|x| match x {
        Decision::Dispatch { ticket, rank } if *ticket == t => Some(*rank),
        _ => None,
    })
}
