//! SVG plots of a [`Report`]:
//! * `latency-cdf.svg`: the latency distribution of every strategy, latency on a log axis against
//!   the percentile on a "nines" axis (p50, p90, p99, p99.9, p99.99), so tails are readable;
//! * `watched-share.svg`: the watched server's share of requests over time (moving average of
//!   five samples);
//! * `watched-queue.svg`: calls on the watched server over time.
//!
//! The time plots show at most eight strategies — all of them when there are that few, else
//! round robin, the six best by p99 and the oracle — so the lines stay apart; the table has every
//! strategy.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::error::SimError;
use crate::report::Report;

const SIZE: (u32, u32) = (960, 600);

/// Write the plots into `dir` (created if missing) and return their paths.
///
/// # Errors
/// When the folder or a file cannot be written.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::Output {
        path: dir.display().to_string(),
        source: e,
    })?;
    let files = [
        (
            dir.join("latency-cdf.svg"),
            latency_cdf as fn(&Report, &Path) -> Result<(), String>,
        ),
        (dir.join("watched-share.svg"), watched_share),
        (dir.join("watched-queue.svg"), watched_queue),
    ];
    for (path, draw) in &files {
        draw(report, path).map_err(|e| SimError::Output {
            path: path.display().to_string(),
            source: std::io::Error::other(e),
        })?;
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

/// Width of the legend panel on the right.
const LEGEND_W: u32 = 220;

/// Most strategies drawn in the time plots.
const MAX_TIME_LINES: usize = 8;

fn color(i: usize) -> RGBColor {
    // Tableau 20: ten hues, dark then light.
    const PALETTE: [RGBColor; 20] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(174, 199, 232),
        RGBColor(255, 187, 120),
        RGBColor(152, 223, 138),
        RGBColor(255, 152, 150),
        RGBColor(197, 176, 213),
        RGBColor(196, 156, 148),
        RGBColor(247, 182, 210),
        RGBColor(199, 199, 199),
        RGBColor(219, 219, 141),
        RGBColor(158, 218, 229),
    ];
    PALETTE[i % PALETTE.len()]
}

/// Draw `names` with their colours down the legend panel.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    names: &[(usize, String)],
) -> Result<(), String> {
    for (row, (i, name)) in names.iter().enumerate() {
        let y = 50 + row as i32 * 22;
        area.draw(&PathElement::new(
            vec![(10, y), (40, y)],
            color(*i).stroke_width(3),
        ))
        .map_err(|e| e.to_string())?;
        area.draw(&Text::new(name.clone(), (48, y - 7), ("sans-serif", 14)))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Which results the time plots show: indices into `report.results`.
fn selected(report: &Report) -> Vec<usize> {
    let n = report.results.len();
    if n <= MAX_TIME_LINES {
        return (0..n).collect();
    }
    let oracle = report
        .results
        .iter()
        .position(|r| r.strategy == crate::ORACLE);
    let rr = report
        .results
        .iter()
        .position(|r| r.strategy == "round-robin");
    let mut ranked: Vec<usize> = (0..n)
        .filter(|&i| Some(i) != oracle && Some(i) != rr)
        .collect();
    ranked.sort_by(|&a, &b| {
        report.results[a]
            .p99_ms
            .total_cmp(&report.results[b].p99_ms)
    });
    let mut pick: Vec<usize> = rr
        .into_iter()
        .chain(ranked.into_iter().take(6))
        .chain(oracle)
        .collect();
    pick.sort_unstable();
    pick
}

/// `-log10(1 - q)`: 1 at p90, 2 at p99, 3 at p99.9.
fn nines(q: f64) -> f64 {
    -(1.0 - q).max(1e-6).log10()
}

fn latency_cdf(report: &Report, path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_W);
    let max = report
        .results
        .iter()
        .flat_map(|r| r.series.cdf.iter().map(|&(ms, _)| ms))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(
            format!(
                "{}: latency by percentile (successful requests)",
                report.scenario
            ),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0.01f64..max * 1.5).log_scale(), 0.0f64..4.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log)")
        .y_desc("percentile")
        .y_labels(5)
        .y_label_formatter(&|y| match y.round() as i64 {
            0 => "p0".to_owned(),
            1 => "p90".to_owned(),
            2 => "p99".to_owned(),
            3 => "p99.9".to_owned(),
            _ => "p99.99".to_owned(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    for (i, r) in report.results.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .series
            .cdf
            .iter()
            .map(|&(ms, q)| (ms.max(0.01), nines(q)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(i).stroke_width(2)))
            .map_err(|e| e.to_string())?;
        names.push((i, r.strategy.clone()));
    }
    draw_legend(&legend_area, &names)?;
    root.present().map_err(|e| e.to_string())
}

fn over_time(
    report: &Report,
    path: &Path,
    title: &str,
    y_desc: &str,
    value: &dyn Fn(usize, usize) -> f64,
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_W);
    let shown = selected(report);
    let t_max = report
        .results
        .iter()
        .flat_map(|r| r.series.t.last().copied())
        .fold(1.0f64, f64::max);
    let y_max = shown
        .iter()
        .flat_map(|&i| (0..report.results[i].series.t.len()).map(move |k| (i, k)))
        .map(|(i, k)| value(i, k))
        .fold(1e-9f64, f64::max);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0f64..t_max, 0.0f64..y_max * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("virtual time, s")
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    for &i in &shown {
        let r = &report.results[i];
        let pts: Vec<(f64, f64)> = r
            .series
            .t
            .iter()
            .enumerate()
            .map(|(k, &t)| (t, value(i, k)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(i).stroke_width(2)))
            .map_err(|e| e.to_string())?;
        names.push((i, r.strategy.clone()));
    }
    draw_legend(&legend_area, &names)?;
    root.present().map_err(|e| e.to_string())
}

fn watched_share(report: &Report, path: &Path) -> Result<(), String> {
    let w = report.watched_index();
    over_time(
        report,
        path,
        &format!(
            "{}: share of requests sent to {} over time",
            report.scenario, report.watched
        ),
        "share of attempts",
        &|i, k| {
            report.results[i].series.share[k]
                .get(w)
                .copied()
                .unwrap_or(0.0)
        },
    )
}

fn watched_queue(report: &Report, path: &Path) -> Result<(), String> {
    over_time(
        report,
        path,
        &format!(
            "{}: calls on {} (served + waiting) over time",
            report.scenario, report.watched
        ),
        "calls on the server",
        &|i, k| report.results[i].series.watch_queue[k],
    )
}
