//! The self-contained HTML reports of `progbench sim` and `progbench compare`: the results table
//! and SVG plots drawn with plotters — JCT and queue-wait CDFs per run, token cache hit over time
//! per run, and per-rank KV usage over time.

use plotters::prelude::*;

use crate::compare::RunResult;
use crate::des::{Report, Series};

type Line<'a> = (String, Vec<(f64, f64)>);

fn chart(title: &str, x_desc: &str, y_desc: &str, y_max: f64, lines: &[Line<'_>]) -> String {
    let x_max = lines
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (720, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..x_max * 1.02, 0f64..y_max)?;
        c.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
        root.present()?;
        Ok(())
    })();
    match drawn {
        Ok(()) => svg,
        Err(e) => format!("<p>plot {title:?} failed: {e}</p>"),
    }
}

/// (value, fraction ≤ value) of ascending `xs`.
fn cdf(xs: &[f64]) -> Vec<(f64, f64)> {
    let n = xs.len().max(1) as f64;
    xs.iter()
        .enumerate()
        .map(|(i, x)| (*x, (i + 1) as f64 / n))
        .collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Table cells: token hit, then JCT mean, p50, p90, p99 in seconds.
fn hit_and_jct(hit: f64, jct: [f64; 4]) -> Vec<String> {
    let mut cells = vec![format!("{:.1}%", hit * 100.0)];
    cells.extend(jct.iter().map(|j| format!("{j:.1}")));
    cells
}

/// The report of `progbench sim`; `header` is free text shown above the table (the oracle line,
/// the command).
pub fn html(header: &str, reports: &[Report]) -> String {
    let columns = [
        "mode",
        "token hit",
        "JCT mean s",
        "p50",
        "p90",
        "p99",
        "queue wait mean s",
        "Programs done",
        "preemptions",
        "force resumes",
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let mut row = vec![r.mode.clone()];
            row.extend(hit_and_jct(
                r.token_hit_rate,
                [
                    r.mean_jct_seconds,
                    r.p50_jct_seconds,
                    r.p90_jct_seconds,
                    r.p99_jct_seconds,
                ],
            ));
            row.extend([
                format!("{:.2}", r.mean_queue_wait_seconds),
                r.programs_completed.to_string(),
                r.preemptions.to_string(),
                r.force_resumes.to_string(),
            ]);
            row
        })
        .collect();
    let runs: Vec<(String, &Series)> = reports
        .iter()
        .map(|r| (r.mode.clone(), &r.series))
        .collect();
    document(
        header,
        &columns,
        &rows,
        &runs,
        "wait before dispatch, seconds",
    )
}

/// The report of `progbench compare`: one row and one set of plots per router variant, from the
/// client's records and the simulators' samples.
pub fn compare_html(header: &str, results: &[RunResult]) -> String {
    let columns = [
        "variant",
        "status",
        "requests",
        "token hit",
        "JCT mean s",
        "p50",
        "p90",
        "p99",
        "queue wait mean s",
        "p99",
        "req/s",
        "output tok/s",
        "Programs done",
        "admissions",
        "force resumes",
        "segment yields",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![
                r.label(),
                r.failure.clone().unwrap_or_else(|| "ok".into()),
                r.requests.to_string(),
            ];
            row.extend(hit_and_jct(
                r.server_token_hit,
                [r.mean_jct, r.p50_jct, r.p90_jct, r.p99_jct],
            ));
            row.extend([
                format!("{:.2}", r.mean_queue_wait),
                format!("{:.2}", r.p99_queue_wait),
                format!("{:.2}", r.request_throughput),
                format!("{:.0}", r.output_token_throughput),
                r.programs_completed.to_string(),
                format!("{:.0}", r.program_admissions),
                format!("{:.0}", r.force_resumes),
                format!("{:.0}", r.segment_yields),
            ]);
            row
        })
        .collect();
    let runs: Vec<(String, &Series)> = results.iter().map(|r| (r.label(), &r.series)).collect();
    document(
        header,
        &columns,
        &rows,
        &runs,
        "latency above unloaded service time, seconds",
    )
}

fn document(
    header: &str,
    columns: &[&str],
    rows: &[Vec<String>],
    runs: &[(String, &Series)],
    wait_desc: &str,
) -> String {
    let head: String = columns
        .iter()
        .map(|c| format!("<th>{}</th>", escape(c)))
        .collect();
    let body: String = rows
        .iter()
        .map(|r| {
            let cells: String = r
                .iter()
                .map(|c| format!("<td>{}</td>", escape(c)))
                .collect();
            format!("<tr>{cells}</tr>\n")
        })
        .collect();
    let each = |f: &dyn Fn(&Series) -> Vec<(f64, f64)>| -> Vec<Line<'_>> {
        runs.iter().map(|(name, s)| (name.clone(), f(s))).collect()
    };
    let mut plots = vec![
        chart(
            "Job completion time (CDF)",
            "JCT, seconds",
            "fraction of Programs",
            1.0,
            &each(&|s| cdf(&s.jcts)),
        ),
        chart(
            "Queue wait (CDF)",
            wait_desc,
            "fraction of requests",
            1.0,
            &each(&|s| cdf(&s.waits)),
        ),
        chart(
            "Token cache hit so far",
            "time, seconds",
            "cached / prompt tokens",
            1.0,
            &each(&|s| s.hit.clone()),
        ),
    ];
    for (name, s) in runs {
        let lines: Vec<Line<'_>> = s
            .kv_usage
            .iter()
            .enumerate()
            .map(|(i, pts)| {
                let label = s.kv_names.get(i).cloned().unwrap_or(format!("rank {i}"));
                (label, pts.clone())
            })
            .collect();
        plots.push(chart(
            &format!("KV usage per rank — {name}"),
            "time, seconds",
            "KV usage",
            1.05,
            &lines,
        ));
    }
    let figures: String = plots
        .into_iter()
        .map(|svg| format!("<figure>{svg}</figure>\n"))
        .collect();
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>progbench report</title>\n\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1500px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #bbb;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}\
         figure{{display:inline-block;margin:8px}}</style></head><body>\n\
         <h1>progbench</h1>\n<pre>{}</pre>\n<table><tr>{head}</tr>\n{body}</table>\n{figures}</body></html>\n",
        escape(header)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let c = cdf(&[1.0, 2.0, 2.0, 5.0]);
        assert_eq!(c.last(), Some(&(5.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn charts_are_svg_with_every_series_named() {
        let svg = chart(
            "t",
            "x",
            "y",
            1.0,
            &[
                ("alpha".into(), vec![(0.0, 0.1), (1.0, 0.5)]),
                ("beta".into(), vec![(0.0, 0.2), (2.0, 0.9)]),
            ],
        );
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("alpha") && svg.contains("beta"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
    }
}
