//! Non-negative least squares for the small calibration models, and R².
//!
//! With three unknowns the exact NNLS solution is found by trying every subset of free variables
//! (the others held at zero) and keeping the best non-negative one: 7 tiny normal-equation
//! solves, no iteration, no tolerance to tune.

/// Solves `min ‖X·β − y‖²` subject to `β ≥ 0` for `k ≤ 3` columns. `None` without data.
pub fn nnls(x: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let k = x.first()?.len();
    if k == 0 || k > 3 || x.len() != y.len() {
        return None;
    }
    let mut best: Option<(f64, Vec<f64>)> = None;
    for mask in 1u32..(1 << k) {
        let cols: Vec<usize> = (0..k).filter(|c| mask & (1 << c) != 0).collect();
        let Some(sub) = least_squares(x, y, &cols) else {
            continue;
        };
        if sub.iter().any(|b| *b < 0.0) {
            continue;
        }
        let mut beta = vec![0.0; k];
        for (c, b) in cols.iter().zip(&sub) {
            beta[*c] = *b;
        }
        let sse = sse(x, y, &beta);
        if best.as_ref().is_none_or(|(s, _)| sse < *s) {
            best = Some((sse, beta));
        }
    }
    best.map(|(_, b)| b).or(Some(vec![0.0; k]))
}

fn sse(x: &[Vec<f64>], y: &[f64], beta: &[f64]) -> f64 {
    x.iter()
        .zip(y)
        .map(|(row, yi)| (row.iter().zip(beta).map(|(a, b)| a * b).sum::<f64>() - yi).powi(2))
        .sum()
}

/// Ordinary least squares on the chosen columns (Gaussian elimination on the normal equations).
fn least_squares(x: &[Vec<f64>], y: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let n = cols.len();
    let mut a = vec![vec![0.0; n + 1]; n];
    for (row, yi) in x.iter().zip(y) {
        for i in 0..n {
            for j in 0..n {
                a[i][j] += row[cols[i]] * row[cols[j]];
            }
            a[i][n] += row[cols[i]] * yi;
        }
    }
    for i in 0..n {
        let p = (i..n).max_by(|r, s| a[*r][i].abs().total_cmp(&a[*s][i].abs()))?;
        a.swap(i, p);
        if a[i][i].abs() < 1e-300 {
            return None;
        }
        let pivot = a[i].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != i {
                let f = row[i] / pivot[i];
                for (cell, p) in row.iter_mut().zip(&pivot).skip(i) {
                    *cell -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

/// Coefficient of determination of `beta` on the data.
pub fn r_squared(x: &[Vec<f64>], y: &[f64], beta: &[f64]) -> f64 {
    let mean = y.iter().sum::<f64>() / y.len().max(1) as f64;
    let tss: f64 = y.iter().map(|v| (v - mean).powi(2)).sum();
    if tss <= 0.0 {
        return 0.0;
    }
    1.0 - sse(x, y, beta) / tss
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_an_exact_quadratic() {
        let xs: Vec<f64> = vec![0.5, 1.0, 2.0, 4.0, 8.0];
        let x: Vec<Vec<f64>> = xs.iter().map(|v| vec![1.0, *v, v * v]).collect();
        let y: Vec<f64> = xs
            .iter()
            .map(|v| 0.066 + 0.057 * v + 0.0044 * v * v)
            .collect();
        let b = nnls(&x, &y).expect("fit");
        assert!(
            (b[0] - 0.066).abs() < 1e-9
                && (b[1] - 0.057).abs() < 1e-9
                && (b[2] - 0.0044).abs() < 1e-9
        );
        assert!((r_squared(&x, &y, &b) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn negative_solutions_are_clamped_to_zero() {
        // y falls with x: the unconstrained slope is negative, the constrained one is 0.
        let x: Vec<Vec<f64>> = (0..5).map(|i| vec![1.0, f64::from(i)]).collect();
        let y = vec![5.0, 4.0, 3.0, 2.0, 1.0];
        let b = nnls(&x, &y).expect("fit");
        assert_eq!(b[1], 0.0);
        assert!((b[0] - 3.0).abs() < 1e-9);
        assert!(nnls(&[], &[]).is_none());
    }
}
