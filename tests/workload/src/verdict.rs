//! Plain-words verdicts: one sentence saying who finished agent sessions sooner, by how much and
//! how sure that is over seeds — what `progbench demo` prints first.

/// Per-seed ratios of `ours` over `theirs` (same seeds, same order): geometric mean, min, max.
pub fn ratios(ours: &[f64], theirs: &[f64]) -> Option<(f64, f64, f64)> {
    let r: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .filter(|(a, b)| **a > 0.0 && **b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    if r.is_empty() {
        return None;
    }
    let g = (r.iter().map(|x| x.ln()).sum::<f64>() / r.len() as f64).exp();
    let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((g, lo, hi))
}

fn pct(x: f64) -> String {
    format!("{}%", num(x))
}

fn num(x: f64) -> String {
    format!("{:.0}", (x * 100.0).abs())
}

/// "(8–15% over 2 seeds)" for the per-seed amounts `a` and `b` (fractions, either order), or
/// "(5% on each of 2 seeds)" / "(10% on one seed)" when they round to one number.
fn spread(a: f64, b: f64, n: usize) -> String {
    let (lo, hi) = (num(a.min(b)), num(a.max(b)));
    match n {
        1 => format!("({hi}% on one seed)"),
        _ if lo == hi => format!("({hi}% on each of {n} seeds)"),
        _ => format!("({lo}–{hi}% over {n} seeds)"),
    }
}

/// "finished sessions 12% sooner on average than WHOM (8–15% over 2 seeds)", "… later …", or
/// level when the seeds disagree (one seed sooner, another later).
pub fn sentence(ours: &[f64], theirs: &[f64], whom: &str) -> String {
    let n = ours.len().min(theirs.len());
    let seeds = if n == 1 {
        "one seed".to_string()
    } else {
        format!("{n} seeds")
    };
    match ratios(ours, theirs) {
        None => format!("could not be compared with {whom} (a run failed)"),
        Some((g, lo, hi)) if hi < 1.0 => format!(
            "finished sessions {} sooner on average than {whom} {}",
            pct(1.0 - g),
            spread(1.0 - hi, 1.0 - lo, n)
        ),
        Some((g, lo, hi)) if lo > 1.0 => format!(
            "finished sessions {} later on average than {whom} {}",
            pct(g - 1.0),
            spread(lo - 1.0, hi - 1.0, n)
        ),
        Some((_, lo, hi)) => format!(
            "ended level with {whom}: from {} sooner to {} later over {seeds}, within the \
             seed-to-seed spread",
            pct(1.0 - lo),
            pct(hi - 1.0)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentence_says_who_wins_by_how_much_and_when_nobody_does() {
        assert_eq!(
            sentence(&[80.0, 90.0], &[100.0, 100.0], "X"),
            "finished sessions 15% sooner on average than X (10–20% over 2 seeds)"
        );
        assert_eq!(
            sentence(&[110.0], &[100.0], "X"),
            "finished sessions 10% later on average than X (10% on one seed)"
        );
        assert_eq!(
            sentence(&[95.2, 94.8], &[100.0, 100.0], "X"),
            "finished sessions 5% sooner on average than X (5% on each of 2 seeds)"
        );
        let level = sentence(&[95.0, 103.0], &[100.0, 100.0], "X");
        assert!(
            level.starts_with("ended level with X: from 5% sooner to 3% later"),
            "{level}"
        );
        assert!(sentence(&[0.0], &[100.0], "X").contains("could not be compared"));
    }
}
