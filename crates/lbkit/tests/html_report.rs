//! The HTML reports of `lbkit sim` and `lbkit tune` in a real browser (issue 17): Debian's
//! Chromium, headless, loads each page with no console message (a script error, or anything
//! the page logs, would be one), runs the page's script to its end, and its screenshot shows
//! the plots: the plots' palette covers a good part of it. Skipped locally without
//! `LBKIT_CHROMIUM` (`eval "$(scripts/chromium.sh)"`); `scripts/test.sh` sets it, and CI fails
//! without it.

use std::path::Path;
use std::process::{Command, Output};

/// The plots' colours (Tableau's first four), as the SVGs fill bars and draw lines.
const PALETTE: [[u8; 3]; 4] = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40]];

/// A fresh directory, removed with everything in it when the value drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-html-{name}-"))
        .tempdir()
        .unwrap()
}

fn lbkit(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(args)
        .output()
        .expect("run lbkit");
    assert!(
        out.status.success(),
        "lbkit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Chromium, headless and cut off from the network (the flags the machine's notes give), on
/// `page` with `extra` arguments; at most two minutes.
fn chromium(bin: &str, page: &Path, profile: &Path, extra: &[&str]) -> Output {
    let out = Command::new("timeout")
        .arg("120")
        .arg(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Load `page`, check it, and return its screenshot's pixel counts per palette colour.
fn check_page(bin: &str, page: &Path, dir: &Path) {
    let shot = dir.join("screenshot.png");
    let out = chromium(
        bin,
        page,
        &dir.join("profile"),
        &[
            "--window-size=1200,3000",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr);
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console.is_empty(),
        "{}: console says {console:#?}",
        page.display()
    );

    let dom = chromium(bin, page, &dir.join("profile"), &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("data-sortable=\"ready\""),
        "{}: the page's script did not run to its end",
        page.display()
    );

    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let pixels = &buf[..info.buffer_size()];
    let mut counts = [0usize; PALETTE.len()];
    for px in pixels.chunks(channels) {
        if let Some(i) = PALETTE.iter().position(|c| px[..3] == c[..]) {
            counts[i] += 1;
        }
    }
    let total = (info.width * info.height) as usize;
    eprintln!(
        "{}: {}x{} screenshot, palette pixels {counts:?}",
        page.display(),
        info.width,
        info.height
    );
    assert!(
        counts.iter().filter(|&&n| n > 300).count() >= 3,
        "{}: the plots are not on the screenshot ({counts:?})",
        page.display()
    );
    // The sim page's plots cover about 0.9 % of its screenshot (30 800 of 3.6 M pixels in
    // the strategies' colours, 2026-12-05); a page without its plots has none of them.
    assert!(
        counts.iter().sum::<usize>() * 200 > total,
        "{}: plots cover under 0.5 % of the page ({counts:?} of {total})",
        page.display()
    );
}

#[test]
fn sim_and_tune_pages_load_cleanly_and_show_their_plots() {
    let Some(bin) = lbkit_testkit::chromium() else {
        return;
    };
    // Every strategy: 17 and the oracle, grouped where identical.
    let sim_dir = scratch("sim");
    let sim = sim_dir.path();
    let out = lbkit(&["sim", "-n", "3000", "--out", sim.to_str().unwrap()]);
    assert!(out.contains("report: "), "{out}");
    check_page(&bin, &sim.join("index.html"), sim);

    let tune_dir = scratch("tune");
    let tune = tune_dir.path();
    lbkit(&[
        "tune",
        "-s",
        "slow-provider",
        "--strategies",
        "p2c-ewma,least-active,random,shortest-response",
        "-n",
        "3000",
        "--out",
        tune.to_str().unwrap(),
    ]);
    check_page(&bin, &tune.join("index.html"), tune);
}
