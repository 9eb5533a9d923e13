//! `progbench fairness` on a tiny configuration: real binaries on loopback, fresh simulators per
//! run, every request served in every variant, and the light tenants ahead of the power user's
//! backlog only when fair queueing is on.

use progbench::fairness::{FairSetup, FairVariant, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_queueing_puts_light_tenants_ahead_of_a_backlog_and_serves_everything() {
    let (dir, vllm_router) = progbench::compare::test_binaries();
    // A backlog that keeps one 4-sequence rank busy for about half a second of wall time, with the
    // light tenants arriving early in it: under FIFO they wait for nearly all of it.
    let setup = FairSetup {
        power_requests: 60,
        light_tenants: 3,
        light_requests: 2,
        light_delay: 0.05,
        max_tokens: 32,
        prompt_words: 16,
        max_num_seqs: 4,
        time_scale: 10.0,
        max_waiting: 1,
        bin_dir: dir,
        vllm_router: vllm_router.clone(),
    };

    let mut variants = vec![FairVariant::Fifo, FairVariant::RoundRobin, FairVariant::Vtc];
    if vllm_router.is_some() {
        variants.push(FairVariant::VllmRouter);
    }
    let mut results = Vec::new();
    for v in variants {
        let r = run(v, &setup).await;
        assert!(r.ok, "{v:?}: {:?}", r.failure);
        results.push(r);
    }
    let tokens = results[0].output_tokens;
    assert!(tokens > 0);
    for r in &results {
        assert_eq!(
            r.output_tokens, tokens,
            "{:?} served different work",
            r.variant
        );
        assert!(r.jain > 0.0 && r.jain <= 1.0 + 1e-9, "{r:?}");
    }
    let (fifo, vtc) = (&results[0], &results[2]);
    eprintln!(
        "light p95 TTFT: FIFO {:.3} s, VTC {:.3} s; Jain FIFO {:.2}, VTC {:.2}",
        fifo.light_ttft_p95, vtc.light_ttft_p95, fifo.jain, vtc.jain
    );
    assert!(
        vtc.light_ttft_p95 < fifo.light_ttft_p95,
        "light tenants wait less with VTC: {vtc:?} vs {fifo:?}"
    );
    assert!(vtc.jain > fifo.jain, "{vtc:?} vs {fifo:?}");
}
