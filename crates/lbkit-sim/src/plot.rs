//! SVG plots of a [`Report`]: latency CDF per strategy (log scale), the watched server's share of
//! requests over time, and its queue length over time.

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

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
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
    ];
    PALETTE[i % PALETTE.len()]
}

fn latency_cdf(report: &Report, path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max = report
        .results
        .iter()
        .flat_map(|r| r.series.cdf.iter().map(|&(ms, _)| ms))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: latency CDF (successful requests)", report.scenario),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((0.01f64..max * 1.5).log_scale(), 0.0f64..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in report.results.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .series
            .cdf
            .iter()
            .map(|&(ms, q)| (ms.max(0.01), q))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(i).stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(r.strategy.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color(i)));
    }
    legend(&mut chart)?;
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
    let t_max = report
        .results
        .iter()
        .flat_map(|r| r.series.t.last().copied())
        .fold(1.0f64, f64::max);
    let y_max = report
        .results
        .iter()
        .enumerate()
        .flat_map(|(i, r)| (0..r.series.t.len()).map(move |k| (i, k)))
        .map(|(i, k)| value(i, k))
        .fold(1e-9f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
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
    for (i, r) in report.results.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .series
            .t
            .iter()
            .enumerate()
            .map(|(k, &t)| (t, value(i, k)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(i).stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(r.strategy.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color(i)));
    }
    legend(&mut chart)?;
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

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}
