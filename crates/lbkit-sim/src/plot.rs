//! SVG plots of a [`Report`]:
//! * `ranked-p99.svg`: every strategy's p99 as a bar, best first, with its failures noted:
//!   the verdict at a glance, however many strategies ran;
//! * `latency-cdf.svg`: the latency distribution of every strategy, latency on a log axis against
//!   the percentile on a "nines" axis (p50, p90, p99, p99.9, p99.99), so tails are readable;
//! * `watched-share.svg`: the watched server's share of requests over time (moving average of
//!   five samples);
//! * `watched-queue.svg`: calls on the watched server over time.
//!
//! Strategies whose runs came out identical ([`Report::groups`]) are drawn once, labelled with
//! the first of them and how many more. The time plots show at most eight lines — all of them
//! when there are that few, else round robin, the six best by p99 and the oracle — so the lines
//! stay apart; the table has every strategy.

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
            dir.join("ranked-p99.svg"),
            ranked_p99 as fn(&Report, &Path) -> Result<(), String>,
        ),
        (dir.join("latency-cdf.svg"), latency_cdf),
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

/// Width of the legend panel on the right: room for 36 characters of a label.
const LEGEND_W: u32 = 300;
/// Characters of a label the legend shows (the ranked chart and the tables show them whole).
const LEGEND_CHARS: usize = 36;

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
        area.draw(&Text::new(
            shorten(name, LEGEND_CHARS),
            (48, y - 7),
            ("sans-serif", 14),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One line of a plot: a group of identical results, drawn in its group's colour.
struct Line {
    /// The group's first member: its data is the group's.
    result: usize,
    /// The group's position, which picks its colour in every plot.
    color: usize,
    label: String,
}

/// One line per group of identical results ([`Report::groups`]).
fn lines(report: &Report) -> Vec<Line> {
    report
        .groups()
        .into_iter()
        .enumerate()
        .map(|(color, g)| Line {
            result: g[0],
            color,
            label: match g.len() {
                1 => report.results[g[0]].strategy.clone(),
                n => format!("{} (+{} same)", report.results[g[0]].strategy, n - 1),
            },
        })
        .collect()
}

/// Which lines the time plots show.
fn selected(report: &Report) -> Vec<Line> {
    let all = lines(report);
    if all.len() <= MAX_TIME_LINES {
        return all;
    }
    let strategy = |l: &Line| report.results[l.result].strategy.as_str();
    let (kept, mut ranked): (Vec<Line>, Vec<Line>) = all
        .into_iter()
        .partition(|l| strategy(l) == crate::ORACLE || strategy(l) == "round-robin");
    ranked.sort_by(|a, b| {
        report.results[a.result]
            .p99_ms
            .total_cmp(&report.results[b.result].p99_ms)
    });
    let mut pick: Vec<Line> = kept
        .into_iter()
        .chain(ranked.into_iter().take(MAX_TIME_LINES - 2))
        .collect();
    pick.sort_by_key(|l| l.color);
    pick
}

/// One bar of a ranked chart.
#[derive(Debug, Clone)]
pub struct Bar {
    /// What it stands for.
    pub label: String,
    /// Its length.
    pub value: f64,
    /// Written after the value (failures, spread), may be empty.
    pub note: String,
    /// Colour index (the palette of the other plots).
    pub color: usize,
}

/// Height of one bar's row in a ranked chart, px.
const BAR_ROW: u32 = 26;
/// Width of the label column of a ranked chart, px: room for [`BAR_LABEL_CHARS`] at 13 px.
const BAR_LABELS: i32 = 400;
/// Characters of a bar's label shown (the tables have them whole).
const BAR_LABEL_CHARS: usize = 54;

/// Horizontal bars, one per row in the order given, labels on the left, each value (with its
/// unit) and note after its bar: readable at any number of rows, the chart grows downwards.
///
/// # Errors
/// When the file cannot be written.
pub fn ranked_bars(path: &Path, title: &str, unit: &str, bars: &[Bar]) -> Result<(), SimError> {
    let height = 70 + BAR_ROW * bars.len().max(1) as u32;
    let draw = || -> Result<(), String> {
        let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        root.draw(&Text::new(title.to_owned(), (10, 12), ("sans-serif", 20)))
            .map_err(|e| e.to_string())?;
        let max = bars.iter().map(|b| b.value).fold(1e-9f64, f64::max);
        // Room after the longest bar for its value and note.
        let span = f64::from(SIZE.0 as i32 - BAR_LABELS - 200);
        for (row, bar) in bars.iter().enumerate() {
            let y = 50 + row as i32 * BAR_ROW as i32;
            let len = if bar.value.is_finite() {
                (bar.value / max * span).max(1.0) as i32
            } else {
                span as i32
            };
            root.draw(&Text::new(
                shorten(&bar.label, BAR_LABEL_CHARS),
                (10, y + 4),
                ("sans-serif", 13),
            ))
            .map_err(|e| e.to_string())?;
            root.draw(&Rectangle::new(
                [(BAR_LABELS, y), (BAR_LABELS + len, y + BAR_ROW as i32 - 8)],
                color(bar.color).filled(),
            ))
            .map_err(|e| e.to_string())?;
            let value = format!("{} {unit}  {}", number(bar.value), bar.note);
            root.draw(&Text::new(
                value.trim_end().to_owned(),
                (BAR_LABELS + len + 6, y + 4),
                ("sans-serif", 13),
            ))
            .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())
    };
    draw().map_err(|e| SimError::Output {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })
}

/// A value with as many decimals as its size needs.
fn number(v: f64) -> String {
    match v {
        v if !v.is_finite() => "∞".to_owned(),
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

/// At most `n` characters, an ellipsis marking a cut.
fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(n - 1).collect();
    out.push('…');
    out
}

/// The strategies ranked by p99 (failed requests noted), best first: one bar per group.
fn ranked_p99(report: &Report, path: &Path) -> Result<(), String> {
    let mut all = lines(report);
    all.sort_by(|a, b| {
        crate::report::score(&report.results[a.result])
            .total_cmp(&crate::report::score(&report.results[b.result]))
    });
    let bars: Vec<Bar> = all
        .into_iter()
        .map(|l| {
            let r = &report.results[l.result];
            let failed = (r.error_rate + r.timeout_rate) * 100.0;
            Bar {
                label: l.label,
                value: r.p99_ms,
                note: if failed > 0.0 {
                    format!("({failed:.2} % failed)")
                } else {
                    String::new()
                },
                color: l.color,
            }
        })
        .collect();
    let title = format!(
        "{}: p99 latency, best first (failed requests count against a strategy)",
        report.scenario
    );
    ranked_bars(path, &title, "ms", &bars).map_err(|e| e.to_string())
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
    for line in lines(report) {
        let pts: Vec<(f64, f64)> = report.results[line.result]
            .series
            .cdf
            .iter()
            .map(|&(ms, q)| (ms.max(0.01), nines(q)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(line.color).stroke_width(2)))
            .map_err(|e| e.to_string())?;
        names.push((line.color, line.label));
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
        .map(|l| l.result)
        .flat_map(|i| (0..report.results[i].series.t.len()).map(move |k| (i, k)))
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
    for line in shown {
        let i = line.result;
        let pts: Vec<(f64, f64)> = report.results[i]
            .series
            .t
            .iter()
            .enumerate()
            .map(|(k, &t)| (t, value(i, k)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(line.color).stroke_width(2)))
            .map_err(|e| e.to_string())?;
        names.push((line.color, line.label));
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
