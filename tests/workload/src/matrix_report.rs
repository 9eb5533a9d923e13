//! How `progbench matrix` shows its cells: a text table (one line per cell, the goals it missed),
//! a summary per goal, and an HTML heat map of Program scheduling ÷ consistent hashing.

use std::fmt::Write as _;

use crate::families::Family;
use crate::matrix::{Cell, Pressure, TUNING_FAMILIES};

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |x| format!("{x:.2}×"))
}

fn range(r: Option<(f64, f64)>) -> String {
    r.map_or(String::new(), |(lo, hi)| format!("{lo:.2}–{hi:.2}"))
}

/// The bounds table (`--bounds`): each pressured cell's excess for both modes, then under free
/// retention, with the engine's end hint, with clairvoyant retention on top of the end hint, and
/// with each Program's remaining work known (shortest first, stock engine) and estimated from
/// its class, against the goal (half of hashing's excess). Free retention is not physical (a
/// kept prefix takes no KV): a goal above it cannot be met by keeping prefixes, whatever the
/// router knows. Clairvoyant retention is physical: a goal below it needs more than retention
/// decisions.
pub fn bounds(cells: &[Cell]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "excess, seconds. free: every prefix ever computed stays a hit at no KV cost; end hint: \
         ours on engines that evict an ended Program's blocks first; clairvoyant: the end hint, \
         and each pause held exactly when holding costs less than re-prefilling (gaps known); \
         work known: ours with the Program with the least work left resumed first; by class: \
         the same with the work left estimated from the lengths of its class's Programs"
    );
    let _ = writeln!(
        s,
        "{:<14} {:<9} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9} {:>11} {:>10} {:>9}  free / clairvoyant / work known / by class vs goal",
        "family",
        "pressure",
        "hashing",
        "ours",
        "goal",
        "hash free",
        "ours free",
        "end hint",
        "clairvoyant",
        "work known",
        "by class"
    );
    let secs = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}s"));
    for c in cells {
        let (Some(bh), Some(bp)) = (c.bound_hash_excess, c.bound_program_excess) else {
            continue;
        };
        let goal = 0.5 * c.hash_excess;
        let free = if bh.min(bp) <= goal {
            "reachable"
        } else {
            "out of reach"
        };
        let against = |bound: Option<f64>| match bound {
            Some(x) if x <= goal => " / met",
            Some(_) => " / not met",
            None => "",
        };
        let (clairvoyant, order, class) = (
            against(c.bound_clairvoyant_excess),
            against(c.bound_order_excess),
            against(c.bound_order_class_excess),
        );
        let _ = writeln!(
            s,
            "{:<14} {:<9} {:>7.1}s {:>7.1}s {:>7.1}s {:>9.1}s {:>9.1}s {:>9} {:>11} {:>10} {:>9}  {free}{clairvoyant}{order}{class}",
            format!("{}{}", c.family.name(), if c.held_out { "" } else { "*" }),
            c.pressure.name(),
            c.hash_excess,
            c.program_excess,
            goal,
            bh,
            bp,
            secs(c.bound_end_hint_excess),
            secs(c.bound_clairvoyant_excess),
            secs(c.bound_order_excess),
            secs(c.bound_order_class_excess),
        );
    }
    s
}

/// The text table: excess above the floor (seconds) for both modes, their ratio with its range
/// over seeds, mean/p90/p99 ratios and token hits, ours ÷ affinity only, and the goals missed.
pub fn table(cells: &[Cell]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<14} {:<9} {:>6} {:>8} {:>8} {:>8} {:>7} {:>11} {:>6} {:>6} {:>6} {:>13} {:>8}  goals",
        "family",
        "pressure",
        "demand",
        "floor",
        "hashing",
        "ours",
        "ours÷",
        "seed range",
        "mean",
        "p90",
        "p99",
        "hit hash/ours",
        "mean"
    );
    let _ = writeln!(
        s,
        "{:<14} {:<9} {:>6} {:>8} {:>8} {:>8} {:>7} {:>11} {:>6} {:>6} {:>6} {:>13} {:>8}",
        "",
        "",
        "p90",
        "mean JCT",
        "excess",
        "excess",
        "hashing",
        "",
        "ours÷",
        "ours÷",
        "ours÷",
        "",
        "ours÷aff"
    );
    for c in cells {
        let missed: Vec<&str> = c.goals.iter().filter(|g| !g.met).map(|g| g.name).collect();
        let _ = writeln!(
            s,
            "{:<14} {:<9} {:>5.2}× {:>7.1}s {:>7.1}s {:>7.1}s {:>7} {:>11} {:>6.3} {:>6.3} {:>6.3} {:>6.1}/{:<5.1} {:>8.3}  {}",
            format!("{}{}", c.family.name(), if c.held_out { "" } else { "*" }),
            c.pressure.name(),
            c.demand,
            c.floor_mean_jct,
            c.hash_excess,
            c.program_excess,
            ratio(c.excess_ratio),
            range(c.excess_ratio_range),
            c.mean_ratio.0,
            c.p90_ratio.0,
            c.p99_ratio.0,
            c.hash_hit * 100.0,
            c.program_hit * 100.0,
            c.affinity_mean_ratio.0,
            if missed.is_empty() {
                "met".to_string()
            } else {
                format!("NOT MET: {}", missed.join("; "))
            }
        );
    }
    s
}

/// Per goal: cells met of cells held to it, over all cells and over held-out families.
pub fn summary(cells: &[Cell]) -> String {
    let mut names: Vec<&str> = cells
        .iter()
        .flat_map(|c| c.goals.iter().map(|g| g.name))
        .collect();
    names.dedup();
    let mut seen = Vec::new();
    let mut s = String::new();
    for n in names {
        if seen.contains(&n) {
            continue;
        }
        seen.push(n);
        let count = |held_out_only: bool| {
            let held: Vec<bool> = cells
                .iter()
                .filter(|c| !held_out_only || c.held_out)
                .flat_map(|c| c.goals.iter().filter(|g| g.name == n).map(|g| g.met))
                .collect();
            (held.iter().filter(|m| **m).count(), held.len())
        };
        let (m, t) = count(false);
        let (hm, ht) = count(true);
        let _ = writeln!(
            s,
            "{n}: met in {m} of {t} cells ({hm} of {ht} in held-out families)"
        );
    }
    let pressured: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.pressure != Pressure::None)
        .collect();
    if !pressured.is_empty() {
        let behind: Vec<String> = pressured
            .iter()
            .filter(|c| c.affinity_mean_ratio.0 > 1.0 + crate::matrix::WORSE_TOLERANCE)
            .map(|c| {
                format!(
                    "{} {} {:.3}×",
                    c.family.name(),
                    c.pressure.name(),
                    c.affinity_mean_ratio.0
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "holding paid (mean ≤ affinity only's, within 1 %; not a goal): {} of {} pressured cells{}",
            pressured.len() - behind.len(),
            pressured.len(),
            if behind.is_empty() {
                String::new()
            } else {
                format!("; behind in {}", behind.join(", "))
            }
        );
    }
    s
}

/// Green below `good`, red above 1, amber between.
fn colour(x: f64, good: f64) -> &'static str {
    if x <= good {
        "#b7e1b0"
    } else if x <= 1.0 + crate::matrix::WORSE_TOLERANCE {
        "#f6e3a1"
    } else {
        "#f2a7a0"
    }
}

/// The heat map page: one grid per ratio (excess, mean, p90, p99), families × pressures.
pub fn html(header: &str, cells: &[Cell]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!doctype html><meta charset=utf-8><title>progbench matrix</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}\
         td,th{{border:1px solid #999;padding:.4em .7em;text-align:center}}td small{{color:#444}}</style>\
         <h1>Program scheduling ÷ consistent hashing</h1><pre>{}</pre>\
         <p>Below 1 Program scheduling is better. Green: the cell's goal is met (excess ≤ 0.5×; \
         tails and means ≤ 1×); red: worse than hashing. Families marked * helped choose the \
         defaults; the others are held out.</p>",
        escape(header)
    );
    type Pick = fn(&Cell) -> Option<(f64, String)>;
    let grids: [(&str, f64, Pick); 5] = [
        (
            "Mean JCT above the floor (excess), ours ÷ hashing",
            0.5,
            |c| {
                c.excess_ratio
                    .map(|r| (r, range(c.excess_ratio_range)))
                    .or(Some((0.0, "nothing to win".into())))
            },
        ),
        ("Mean JCT, ours ÷ hashing", 1.0, |c| {
            Some((
                c.mean_ratio.0,
                format!("{:.2}–{:.2}", c.mean_ratio.1, c.mean_ratio.2),
            ))
        }),
        ("p90 JCT, ours ÷ hashing", 1.0, |c| {
            Some((
                c.p90_ratio.0,
                format!("{:.2}–{:.2}", c.p90_ratio.1, c.p90_ratio.2),
            ))
        }),
        ("p99 JCT, ours ÷ hashing", 1.0, |c| {
            Some((
                c.p99_ratio.0,
                format!("{:.2}–{:.2}", c.p99_ratio.1, c.p99_ratio.2),
            ))
        }),
        (
            "Mean JCT, ours ÷ affinity only (binding_only: nothing held back; not a goal)",
            1.0,
            |c| {
                let (g, lo, hi) = c.affinity_mean_ratio;
                Some((g, format!("{lo:.2}–{hi:.2}")))
            },
        ),
    ];
    let mut families: Vec<Family> = cells.iter().map(|c| c.family).collect();
    families.dedup();
    let mut pressures: Vec<Pressure> = cells.iter().map(|c| c.pressure).collect();
    pressures.sort();
    pressures.dedup();
    for (title, good, pick) in grids {
        let _ = write!(s, "<h2>{}</h2><table><tr><th>family</th>", escape(title));
        for p in &pressures {
            let _ = write!(s, "<th>{} ({}× KV)</th>", p.name(), p.demand());
        }
        s.push_str("</tr>");
        for f in &families {
            let star = if TUNING_FAMILIES.contains(f) { "*" } else { "" };
            let _ = write!(s, "<tr><th>{}{star}</th>", f.name());
            for p in &pressures {
                match cells
                    .iter()
                    .find(|c| c.family == *f && c.pressure == *p)
                    .and_then(pick)
                {
                    Some((x, note)) => {
                        let _ = write!(
                            s,
                            "<td style=\"background:{}\">{x:.2}×<br><small>{}</small></td>",
                            colour(x, good),
                            escape(&note)
                        );
                    }
                    None => s.push_str("<td>-</td>"),
                }
            }
            s.push_str("</tr>");
        }
        s.push_str("</table>");
    }
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
