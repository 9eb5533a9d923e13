//! The tables `progbench sim` prints: the oracle's line, where hit was lost, and one row per mode.

use super::*;

/// Excess over the oracle, the measure the benchmark goals use.
pub(crate) fn print_oracle(
    o: &progbench::oracle::Oracle,
    kv: &progbench::kv_bound::KvBound,
    runs: impl Iterator<Item = OracleRow>,
) {
    println!(
        "\noracle: H* = {:.1}% token hit, JCT* = {:.1}s mean (no queueing, all hits, batch-1 decode)",
        o.token_hit * 100.0,
        o.mean_jct_seconds
    );
    println!(
        "at this KV, no request held back, ranks' KV pooled: at most {:.1}% token hit (Belady eviction; {:.1}% with LRU, {:.1}% with LRU that drops finished Programs first)",
        kv.token_hit * 100.0,
        kv.lru_token_hit * 100.0,
        kv.lru_release_token_hit * 100.0
    );
    let runs: Vec<OracleRow> = runs.collect();
    let demand = runs.iter().any(|r| r.3.is_some());
    if demand {
        println!(
            "{:<22} {:>12} {:>12} {:>14} {:>14}",
            "mode", "missing hit", "excess JCT", "KV demand p90", "time over KV"
        );
    } else {
        println!("{:<22} {:>12} {:>12}", "mode", "missing hit", "excess JCT");
    }
    for (mode, hit, jct, d) in runs {
        print!(
            "{:<22} {:>10.1}pt {:>11.1}s",
            mode,
            // Rounded first so that a float residue below the bound prints 0.0, not -0.0.
            ((o.token_hit - hit) * 1000.0).round() / 10.0 + 0.0,
            jct - o.mean_jct_seconds
        );
        match d {
            Some((p90, over)) => println!(" {:>13.2}x {:>13.0}%", p90, over * 100.0),
            None => println!(),
        }
    }
}

/// Where each mode lost reusable tokens, in points of its prompt tokens (they add up to its
/// missing hit, less the first turns' system prompts).
pub(crate) fn print_missed(rs: &[Report]) {
    println!(
        "\nmissed reusable tokens (points of prompt tokens) after the Program's previous turn, and the hit\n\
         one pooled cache would have kept on the run's own timeline (Belady / LRU / LRU dropping finished Programs):\n\
         {:<22} {:>9} {:>9} {:>9} {:>9}   {:>22}",
        "mode", "moved", "gap <2s", "2-10s", ">=10s", "pooled on this run"
    );
    for r in rs {
        let pt = |x: u64| x as f64 / r.prompt_tokens.max(1) as f64 * 100.0;
        let m = &r.missed;
        let b = &r.pooled_on_run;
        println!(
            "{:<22} {:>7.2}pt {:>7.2}pt {:>7.2}pt {:>7.2}pt   {:>5.1}% / {:>4.1}% / {:>4.1}%",
            r.mode,
            pt(m.moved),
            pt(m.gap_under_2s),
            pt(m.gap_2_to_10s),
            pt(m.gap_10s_or_more),
            b.token_hit * 100.0,
            b.lru_token_hit * 100.0,
            b.lru_release_token_hit * 100.0
        );
    }
}

pub(crate) fn print_table(rs: &[Report]) {
    println!(
        "{:<22} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>9}",
        "mode",
        "requests",
        "hit",
        "JCT mean",
        "JCT p50",
        "JCT p90",
        "JCT p99",
        "wait",
        "preempt",
        "sched p50",
        "sched p99"
    );
    for r in rs {
        println!(
            "{:<22} {:>9} {:>7.1}% {:>8.1}s {:>8.1}s {:>8.1}s {:>8.1}s {:>7.2}s {:>7} {:>7.2}us {:>7.2}us",
            r.mode,
            r.requests,
            r.token_hit_rate * 100.0,
            r.mean_jct_seconds,
            r.p50_jct_seconds,
            r.p90_jct_seconds,
            r.p99_jct_seconds,
            r.mean_queue_wait_seconds,
            r.preemptions,
            r.scheduler_median_us,
            r.scheduler_p99_us,
        );
    }
    if let Some(first) = rs.first() {
        for r in &rs[1..] {
            if r.prompt_tokens != first.prompt_tokens || r.output_tokens != first.output_tokens {
                println!(
                    "note: {} served different token totals than {} (truncated or timed-out Programs)",
                    r.mode, first.mode
                );
            }
        }
    }
}
