//! Random variates: service times, inter-arrival times, Zipf keys. All draws come from the
//! simulation's seeded [`FastRng`].

use lbkit_core::FastRng;

use crate::scenario::ServiceSpec;

/// A service-time distribution in nanoseconds.
#[derive(Debug, Clone)]
pub(crate) enum ServiceTime {
    Constant(f64),
    Exponential(f64),
    Lognormal {
        mu: f64,
        sigma: f64,
    },
    Pareto {
        scale: f64,
        shape: f64,
    },
    Empirical(Box<[f64]>),
    /// Latencies recorded at each load (calls in flight on the server when the call began).
    ByLoad(Box<LoadTable>),
}

const MS: f64 = 1e6;

/// Fewest samples a load bin keeps on its own; smaller bins join the bin below.
const MIN_BIN: usize = 20;

/// Recorded latencies by load: bins of in-flight levels, each with its samples.
#[derive(Debug, Clone)]
pub(crate) struct LoadTable {
    /// `(lowest load of the bin, its samples in ns)`, by load.
    bins: Vec<(u32, Box<[f64]>)>,
    /// The highest load recorded.
    top: u32,
}

impl LoadTable {
    /// Bins over `rows` of `(load, latency ns)`: one per load up to 32, then each ×1.25 wider
    /// (32, 40, 50, 62, …); a bin of fewer than [`MIN_BIN`] samples takes the next ones in.
    fn new(mut rows: Vec<(u32, f64)>) -> Option<LoadTable> {
        if rows.is_empty() {
            return None;
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let top = rows.last().map_or(0, |r| r.0);
        let bound_of = |load: u32| -> u32 {
            let mut lo = 0u32;
            let mut next = 1u32;
            while next <= load {
                lo = next;
                next = if next < 32 { next + 1 } else { next + next / 4 };
            }
            lo
        };
        let mut bins: Vec<(u32, Vec<f64>)> = Vec::new();
        for (load, ns) in rows {
            let lo = bound_of(load);
            match bins.last_mut() {
                Some((b, v)) if *b == lo || v.len() < MIN_BIN => v.push(ns),
                _ => bins.push((lo, vec![ns])),
            }
        }
        // A last bin too small joins the one before it.
        if bins.len() > 1 && bins.last().is_some_and(|b| b.1.len() < MIN_BIN) {
            if let Some((_, v)) = bins.pop() {
                if let Some(prev) = bins.last_mut() {
                    prev.1.extend(v);
                }
            }
        }
        Some(LoadTable {
            bins: bins
                .into_iter()
                .map(|(lo, v)| (lo, v.into_boxed_slice()))
                .collect(),
            top,
        })
    }

    /// A latency for a call that begins with `load` calls on the server. Past the highest load
    /// recorded, the top bin's samples are scaled by `(load + 1) / (top + 1)`: latency grows
    /// with the load it was never seen at, as a queue's would.
    fn sample(&self, rng: &mut FastRng, load: u32) -> f64 {
        let i = self.bins.partition_point(|b| b.0 <= load).saturating_sub(1);
        let samples = &self.bins[i].1;
        let v = samples[rng.index(samples.len())];
        if load > self.top {
            v * f64::from(load + 1) / f64::from(self.top + 1)
        } else {
            v
        }
    }

    fn mean(&self) -> f64 {
        let (sum, n) = self
            .bins
            .iter()
            .flat_map(|b| b.1.iter())
            .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
        sum / n.max(1) as f64
    }
}

impl ServiceTime {
    /// Check a spec without reading files.
    pub(crate) fn check(spec: &ServiceSpec) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(format!("service.{name} must be positive (got {v})"))
            }
        };
        match spec {
            ServiceSpec::Constant { mean_ms } | ServiceSpec::Exponential { mean_ms } => {
                pos("mean_ms", *mean_ms)
            }
            ServiceSpec::Lognormal { median_ms, sigma } => {
                pos("median_ms", *median_ms).and(pos("sigma", *sigma))
            }
            ServiceSpec::Pareto { scale_ms, shape } => {
                pos("scale_ms", *scale_ms).and(pos("shape", *shape))
            }
            ServiceSpec::Empirical { file } if file.is_empty() => {
                Err("service.file is empty".into())
            }
            ServiceSpec::Empirical { .. } => Ok(()),
            ServiceSpec::ByLoad { file } if file.is_empty() => Err("service.file is empty".into()),
            ServiceSpec::ByLoad { .. } => Ok(()),
        }
    }

    /// Build from a spec, reading an empirical file.
    pub(crate) fn new(spec: &ServiceSpec) -> Result<ServiceTime, String> {
        ServiceTime::check(spec)?;
        Ok(match spec {
            ServiceSpec::Constant { mean_ms } => ServiceTime::Constant(mean_ms * MS),
            ServiceSpec::Exponential { mean_ms } => ServiceTime::Exponential(mean_ms * MS),
            ServiceSpec::Lognormal { median_ms, sigma } => ServiceTime::Lognormal {
                mu: (median_ms * MS).ln(),
                sigma: *sigma,
            },
            ServiceSpec::Pareto { scale_ms, shape } => ServiceTime::Pareto {
                scale: scale_ms * MS,
                shape: *shape,
            },
            ServiceSpec::Empirical { file } => ServiceTime::Empirical(read_samples(file)?),
            ServiceSpec::ByLoad { file } => ServiceTime::ByLoad(Box::new(
                LoadTable::new(read_load_samples(file)?)
                    .ok_or_else(|| format!("{file}: no latencies"))?,
            )),
        })
    }

    /// Mean service time in nanoseconds (infinite for a Pareto shape ≤ 1).
    pub(crate) fn mean(&self) -> f64 {
        match self {
            ServiceTime::Constant(m) | ServiceTime::Exponential(m) => *m,
            ServiceTime::Lognormal { mu, sigma } => (mu + sigma * sigma / 2.0).exp(),
            ServiceTime::Pareto { scale, shape } if *shape > 1.0 => scale * shape / (shape - 1.0),
            ServiceTime::Pareto { .. } => f64::INFINITY,
            ServiceTime::Empirical(s) => s.iter().sum::<f64>() / s.len() as f64,
            ServiceTime::ByLoad(t) => t.mean(),
        }
    }

    /// A service time for a call that begins with `load` other calls on the server (only
    /// load-conditioned distributions look at it).
    #[inline]
    pub(crate) fn sample_at(&self, rng: &mut FastRng, load: u32) -> f64 {
        match self {
            ServiceTime::ByLoad(t) => t.sample(rng, load),
            other => other.sample(rng),
        }
    }

    /// Whether service times depend on the load (a server with such a distribution models
    /// its own queueing: it serves every call at once).
    pub(crate) fn by_load(&self) -> bool {
        matches!(self, ServiceTime::ByLoad(_))
    }

    #[inline]
    pub(crate) fn sample(&self, rng: &mut FastRng) -> f64 {
        match self {
            ServiceTime::Constant(m) => *m,
            ServiceTime::Exponential(m) => exponential(rng, *m),
            ServiceTime::Lognormal { mu, sigma } => (mu + sigma * normal(rng)).exp(),
            ServiceTime::Pareto { scale, shape } => scale / open01(rng).powf(1.0 / shape),
            ServiceTime::Empirical(s) => s[rng.index(s.len())],
            ServiceTime::ByLoad(t) => t.sample(rng, 0),
        }
    }
}

/// Rows `in_flight,latency_ms` (a header line is skipped).
fn read_load_samples(file: &str) -> Result<Vec<(u32, f64)>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("service.file {file}: cannot read: {e}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split(',').map(str::trim);
        let (load, ms) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        match (load.parse::<u32>(), ms.parse::<f64>()) {
            (Ok(l), Ok(v)) if v >= 0.0 && v.is_finite() => out.push((l, v * MS)),
            _ if i == 0 => continue, // a header
            _ => {
                return Err(format!(
                    "{file}:{}: {line:?} is not `in_flight,latency_ms`",
                    i + 1
                ))
            }
        }
    }
    Ok(out)
}

/// Arrival offsets in ms, one per line (a header is skipped), as ns from the first, sorted.
pub(crate) fn read_arrivals(file: &str) -> Result<Box<[u64]>, String> {
    let mut out: Vec<u64> = read_ms_column(file, "workload.arrivals", "a time", "arrivals")?
        .into_iter()
        .map(|ns| ns as u64)
        .collect();
    out.sort_unstable();
    Ok(out.into_boxed_slice())
}

fn read_samples(file: &str) -> Result<Box<[f64]>, String> {
    read_ms_column(file, "service.file", "a latency", "latencies").map(Vec::into_boxed_slice)
}

/// The first column of a CSV file as milliseconds, 0 or more, in ns (a header line is
/// skipped, `#` lines too); `field` and `what` name the file and its values in errors.
fn read_ms_column(file: &str, field: &str, what: &str, plural: &str) -> Result<Vec<f64>, String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("{field} {file}: cannot read: {e}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let cell = line.split(',').next().unwrap_or("").trim();
        if cell.is_empty() || cell.starts_with('#') {
            continue;
        }
        match cell.parse::<f64>() {
            Ok(v) if v >= 0.0 && v.is_finite() => out.push(v * MS),
            Ok(v) => return Err(format!("{file}:{}: {what} {v} is not 0 or more", i + 1)),
            Err(_) if i == 0 => continue, // a header
            Err(_) => return Err(format!("{file}:{}: {cell:?} is not {what} in ms", i + 1)),
        }
    }
    if out.is_empty() {
        return Err(format!("{file}: no {plural}"));
    }
    Ok(out)
}

/// A uniform draw in (0, 1].
#[inline]
fn open01(rng: &mut FastRng) -> f64 {
    1.0 - rng.unit_f64()
}

/// Exponential with the given mean.
#[inline]
pub(crate) fn exponential(rng: &mut FastRng, mean: f64) -> f64 {
    -mean * open01(rng).ln()
}

/// Standard normal (Box–Muller; one of the pair).
#[inline]
fn normal(rng: &mut FastRng) -> f64 {
    let (u, v) = (open01(rng), rng.unit_f64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Zipf over `1..=n` by inverse CDF over a precomputed table (O(log n) per draw).
#[derive(Debug, Clone)]
pub(crate) struct Zipf {
    cdf: Box<[f64]>,
}

impl Zipf {
    pub(crate) fn new(n: u32, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                acc += 1.0 / f64::from(k).powf(s);
                acc
            })
            .collect();
        let total = acc;
        cdf.iter_mut().for_each(|c| *c /= total);
        Zipf {
            cdf: cdf.into_boxed_slice(),
        }
    }

    /// A key index in `0..n` (0 the most popular).
    #[inline]
    pub(crate) fn sample(&self, rng: &mut FastRng) -> usize {
        let u = rng.unit_f64();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_of(s: &ServiceTime, n: usize) -> f64 {
        let mut rng = FastRng::seed_from_u64(3);
        (0..n).map(|_| s.sample(&mut rng)).sum::<f64>() / n as f64
    }

    #[test]
    fn sample_means_match() {
        for spec in [
            ServiceSpec::Exponential { mean_ms: 10.0 },
            ServiceSpec::Lognormal {
                median_ms: 8.0,
                sigma: 0.5,
            },
            ServiceSpec::Pareto {
                scale_ms: 2.0,
                shape: 3.0,
            },
            ServiceSpec::Constant { mean_ms: 4.0 },
        ] {
            let s = ServiceTime::new(&spec).unwrap();
            let (m, want) = (mean_of(&s, 400_000), s.mean());
            assert!((m / want - 1.0).abs() < 0.02, "{spec:?}: {m} vs {want}");
        }
    }

    #[test]
    fn zipf_favours_the_first_keys() {
        let z = Zipf::new(1000, 1.1);
        let mut rng = FastRng::seed_from_u64(1);
        let mut counts = [0u32; 3];
        for _ in 0..100_000 {
            let k = z.sample(&mut rng);
            if k < 3 {
                counts[k] += 1;
            }
        }
        // P(k) ∝ k^-1.1: key 1 is 2^1.1 = 2.14 times as popular as key 2.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((ratio - 2.14).abs() < 0.15, "{ratio}");
    }

    #[test]
    fn empirical_files() {
        let dir = tempfile::Builder::new()
            .prefix("lbkit-sim-emp-")
            .tempdir()
            .unwrap();
        let good = dir.path().join("lat.csv");
        std::fs::write(&good, "latency_ms\n1.5\n2.5\n").unwrap();
        let s = ServiceTime::new(&ServiceSpec::Empirical {
            file: good.display().to_string(),
        })
        .unwrap();
        assert_eq!(s.mean(), 2e6);
        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, "1\nfast\n").unwrap();
        let e = ServiceTime::new(&ServiceSpec::Empirical {
            file: bad.display().to_string(),
        })
        .unwrap_err();
        assert!(e.contains("bad.csv:2: \"fast\""), "{e}");
    }
}
