//! The report as one self-contained web page, `index.html` beside the plots: the verdict, the
//! ranked p99 chart, the tables, the other plots and the scenario, with the SVGs inlined and
//! nothing fetched, so the file can be mailed or attached to a ticket and still open.
//!
//! Strategies with identical results share one row ([`Report::groups`]); a click on a column's
//! heading sorts the table by it (the page's only script).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::SimError;
use crate::plot;
use crate::report::{Report, ORACLE};
use crate::scenario::Scenario;
use crate::tune::{Objective, Tuning};

/// What [`write_report`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The SVG plots, the ranked p99 chart first.
    pub plots: Vec<PathBuf>,
    /// The page, `index.html`.
    pub page: PathBuf,
}

/// Write the plots and `index.html` into `dir` (created if missing).
///
/// # Errors
/// When the folder or a file cannot be written.
pub fn write_report(report: &Report, scenario: &Scenario, dir: &Path) -> Result<Written, SimError> {
    let plots = plot::write_plots(report, dir)?;
    let mut page = Page::new(
        &format!("lbkit sim: {}", report.scenario),
        &format!(
            "{} — {} requests per strategy, seed {}",
            report.description, report.requests, report.seed
        ),
    );
    page.verdict(&report.conclusion());
    page.svg(&plots[0])?;
    page.section("Results");
    page.table(&result_head(report), &result_rows(report));
    if report.results.iter().any(|r| r.strategy == ORACLE) {
        page.text(&format!(
            "{ORACLE}: shortest expected delay, seeing every server's true queue and service \
             rate — the best-known baseline, which no real client can run. Strategies whose runs \
             came out identical share a row."
        ));
    }
    for note in &report.notes {
        page.text(&format!("Note: {note}"));
    }
    page.section("Share of requests per server, %");
    page.table(&share_head(report), &share_rows(report));
    page.section("Plots");
    for p in &plots[1..] {
        page.svg(p)?;
    }
    page.section("Scenario");
    page.pre(&scenario.source);
    let path = dir.join("index.html");
    page.write(&path)?;
    Ok(Written { plots, page: path })
}

/// Most candidates drawn in the ranked chart of a search (the table has them all).
const MAX_TUNE_BARS: usize = 40;

/// Write `lbkit tune`'s page into `dir`: the verdict and the configuration to apply, every
/// candidate ranked, then the winner beside the current setting and the runner-ups as `lbkit
/// sim` reports them (plots of [`Tuning::comparison`]), and the scenario.
///
/// # Errors
/// When the folder or a file cannot be written.
pub fn write_tuning(
    tuning: &Tuning,
    scenario: &Scenario,
    service: &str,
    dir: &Path,
) -> Result<Written, SimError> {
    let mut plots = plot::write_plots(&tuning.comparison, dir)?;
    plots.insert(0, write_ranked(tuning, dir)?);
    let mut page = Page::new(
        &format!("lbkit tune: {}", tuning.scenario),
        &tune_subtitle(tuning),
    );
    page.verdict(&tuning.verdict());
    let snippet = tuning.snippet(service);
    if !snippet.is_empty() {
        page.pre(&snippet);
    }
    page.svg(&plots[0])?;
    page.section("Candidates");
    page.table(&tune_head(tuning), &tune_rows(tuning));
    let compared = &tuning.comparison;
    page.section(&format!(
        "The current setting, the winner and the runner-ups on one fresh seed (seed {})",
        compared.seed
    ));
    page.svg(&plots[1])?;
    page.table(&result_head(compared), &result_rows(compared));
    for p in &plots[2..] {
        page.svg(p)?;
    }
    page.section("Scenario");
    page.pre(&scenario.source);
    let path = dir.join("index.html");
    page.write(&path)?;
    Ok(Written { plots, page: path })
}

/// Under the title of `lbkit tune`'s page: the objective and the search's size.
fn tune_subtitle(tuning: &Tuning) -> String {
    format!(
        "objective {} — {} candidates, {} requests per run, {} runs",
        tuning.objective.name(),
        tuning.ranking.len() - 1,
        tuning.requests,
        tuning.runs
    )
}

/// The chart of a search's candidates ranked, `tune-ranked.svg` in `dir`; returns its path.
fn write_ranked(tuning: &Tuning, dir: &Path) -> Result<PathBuf, SimError> {
    let ranked = dir.join("tune-ranked.svg");
    plot::ranked_bars(
        &ranked,
        &format!(
            "{}: {} of each candidate (mean over its seeds), best first{}",
            tuning.scenario,
            tuning.objective.name(),
            if tuning.ranking.len() > MAX_TUNE_BARS {
                format!(" — best {MAX_TUNE_BARS} of {}", tuning.ranking.len())
            } else {
                String::new()
            }
        ),
        if tuning.objective == Objective::Errors {
            "% failed"
        } else {
            "ms"
        },
        &tune_bars(tuning),
    )?;
    Ok(ranked)
}

fn tune_bars(tuning: &Tuning) -> Vec<plot::Bar> {
    let errors = tuning.objective == Objective::Errors;
    tuning
        .ranking
        .iter()
        .take(MAX_TUNE_BARS)
        .map(|c| plot::Bar {
            label: c.label.clone(),
            value: if errors {
                c.objective * 100.0
            } else {
                c.objective
            },
            note: match (c.label == tuning.winner, c.label == tuning.current) {
                (true, true) => "current, kept".to_owned(),
                (true, false) => "winner".to_owned(),
                (false, true) => "current".to_owned(),
                _ if c.fails_more => format!("fails more ({:.2} %)", c.failed * 100.0),
                _ => format!("{} seed(s)", c.seeds),
            },
            // The palette of the other plots: blue, orange for the current setting, green for
            // the winner, grey for a candidate that fails more.
            color: if c.label == tuning.winner {
                2
            } else if c.label == tuning.current {
                1
            } else if c.fails_more {
                7
            } else {
                0
            },
        })
        .collect()
}

fn tune_head(tuning: &Tuning) -> Vec<String> {
    [
        "rank",
        "candidate",
        "rounds",
        "seeds",
        tuning.objective.name(),
        "p99 ms",
        "failed %",
        "",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn tune_rows(tuning: &Tuning) -> Vec<Vec<String>> {
    tuning
        .ranking
        .iter()
        .enumerate()
        .map(|(i, c)| {
            vec![
                (i + 1).to_string(),
                c.label.clone(),
                c.rounds.to_string(),
                c.seeds.to_string(),
                if tuning.objective == Objective::Errors {
                    format!("{:.3}", c.objective * 100.0)
                } else {
                    format!("{:.2}", c.objective)
                },
                format!("{:.2}", c.p99_ms),
                format!("{:.3}", c.failed * 100.0),
                if c.label == tuning.current {
                    "current".to_owned()
                } else if c.fails_more {
                    "fails more than the current setting".to_owned()
                } else {
                    String::new()
                },
            ]
        })
        .collect()
}

fn result_head(report: &Report) -> Vec<String> {
    [
        "strategy",
        "ok req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "err %",
        "timeout %",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        format!("{} %", report.watched),
        format!("{} max queue", report.watched),
    ])
    .collect()
}

fn result_rows(report: &Report) -> Vec<Vec<String>> {
    let w = report.watched_index();
    report
        .groups()
        .iter()
        .map(|g| {
            let r = &report.results[g[0]];
            let s = &r.servers[w];
            vec![
                report.group_label(g),
                format!("{:.1}", r.throughput),
                format!("{:.2}", r.p50_ms),
                format!("{:.2}", r.p90_ms),
                format!("{:.2}", r.p99_ms),
                format!("{:.2}", r.p999_ms),
                format!("{:.2}", r.error_rate * 100.0),
                format!("{:.2}", r.timeout_rate * 100.0),
                format!("{:.2}", s.share * 100.0),
                s.max_queue.to_string(),
            ]
        })
        .collect()
}

fn share_head(report: &Report) -> Vec<String> {
    std::iter::once("strategy".to_owned())
        .chain(
            report
                .results
                .first()
                .into_iter()
                .flat_map(|r| r.servers.iter().map(|s| s.name.clone())),
        )
        .collect()
}

fn share_rows(report: &Report) -> Vec<Vec<String>> {
    report
        .groups()
        .iter()
        .map(|g| {
            std::iter::once(report.group_label(g))
                .chain(
                    report.results[g[0]]
                        .servers
                        .iter()
                        .map(|s| format!("{:.1}", s.share * 100.0)),
                )
                .collect()
        })
        .collect()
}

/// A page being written: a title, then sections of text, tables, plots and code.
#[derive(Debug)]
pub(crate) struct Page {
    title: String,
    body: String,
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;\
padding:0 1em;color:#222}h1{margin-bottom:.2em}.sub{color:#555;margin-top:0}\
.verdict{background:#f3f7fb;border-left:4px solid #1f77b4;padding:.6em 1em;margin:1em 0}\
.verdict p{margin:.3em 0}table{border-collapse:collapse;margin:1em 0;font-size:14px}\
th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}\
td.n{text-align:right}th{cursor:pointer;background:#f6f6f6}\
th[data-order=asc]::after{content:' ▲'}th[data-order=desc]::after{content:' ▼'}\
figure{margin:1em 0}svg{max-width:100%;height:auto}\
pre{background:#f6f6f6;padding:1em;overflow-x:auto}";

/// Sorts a table by the clicked column: numbers as numbers, the rest as text; marks the page
/// `data-sortable="ready"` when set up (what the browser test looks for).
const SCRIPT: &str = "document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0];
    var col = th.cellIndex;
    var asc = th.dataset.order !== 'asc';
    th.closest('tr').querySelectorAll('th').forEach(function (h) { delete h.dataset.order; });
    th.dataset.order = asc ? 'asc' : 'desc';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].textContent, y = b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
document.documentElement.dataset.sortable = 'ready';";

impl Page {
    pub(crate) fn new(title: &str, subtitle: &str) -> Page {
        let mut body = String::new();
        let _ = write!(
            body,
            "<h1>{}</h1>\n<p class=\"sub\">{}</p>\n",
            escape(title),
            escape(subtitle)
        );
        Page {
            title: title.to_owned(),
            body,
        }
    }

    /// A highlighted block, a paragraph per line.
    pub(crate) fn verdict(&mut self, text: &str) {
        self.body.push_str("<div class=\"verdict\">\n");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let _ = writeln!(self.body, "<p>{}</p>", escape(line));
        }
        self.body.push_str("</div>\n");
    }

    pub(crate) fn section(&mut self, heading: &str) {
        let _ = writeln!(self.body, "<h2>{}</h2>", escape(heading));
    }

    pub(crate) fn text(&mut self, text: &str) {
        let _ = writeln!(self.body, "<p>{}</p>", escape(text));
    }

    pub(crate) fn pre(&mut self, text: &str) {
        let _ = writeln!(self.body, "<pre>{}</pre>", escape(text));
    }

    /// A table sortable by any column.
    pub(crate) fn table(&mut self, head: &[String], rows: &[Vec<String>]) {
        self.body
            .push_str("<table class=\"sortable\">\n<thead><tr>");
        for h in head {
            let _ = write!(self.body, "<th>{}</th>", escape(h));
        }
        self.body.push_str("</tr></thead>\n<tbody>\n");
        for row in rows {
            self.body.push_str("<tr>");
            for cell in row {
                let class = if cell.parse::<f64>().is_ok() {
                    " class=\"n\""
                } else {
                    ""
                };
                let _ = write!(self.body, "<td{class}>{}</td>", escape(cell));
            }
            self.body.push_str("</tr>\n");
        }
        self.body.push_str("</tbody></table>\n");
    }

    /// An SVG file, inlined.
    pub(crate) fn svg(&mut self, path: &Path) -> Result<(), SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Output {
            path: path.display().to_string(),
            source: e,
        })?;
        let start = text.find("<svg").unwrap_or(0);
        let _ = writeln!(self.body, "<figure>{}</figure>", text[start..].trim_end());
        Ok(())
    }

    pub(crate) fn write(&self, path: &Path) -> Result<(), SimError> {
        let page = format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{}\
             <script>\n{SCRIPT}\n</script>\n</body>\n</html>\n",
            escape(&self.title),
            self.body
        );
        std::fs::write(path, page).map_err(|e| SimError::Output {
            path: path.display().to_string(),
            source: e,
        })
    }
}

/// Text made safe to put between tags.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_control_characters_replaced() {
        assert_eq!(
            escape("a<b & \"c\"\u{1}\n"),
            "a&lt;b &amp; &quot;c&quot;\u{fffd}\n"
        );
    }
}
