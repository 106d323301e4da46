//! A strategy label's run suffixes, after `NAME[:k=v...]`: `+hedge` or `+hedge=DELAY` (hedged
//! requests), `+aperture=N` (Finagle's deterministic aperture of N endpoints per client, each
//! client at its own index) and `+subset=N` (gRPC A68 random subsetting of N per client).

use lbkit_core::stage::ApertureMode;
use lbkit_core::HedgeDelay;

use crate::error::SimError;
use crate::scenario::Scenario;

/// What a label's suffixes ask of its run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RunSpec {
    /// Hedge after this delay.
    pub(crate) hedge: Option<HedgeDelay>,
    /// Each client's aperture: how it is chosen, and its size.
    pub(crate) aperture: Option<(ApertureMode, u32)>,
}

/// `label` split into its strategy and its run suffixes.
///
/// # Errors
/// An unknown suffix, a hedge delay or aperture size that does not parse.
pub(crate) fn split_run<'l>(
    label: &'l str,
    scenario: Option<&Scenario>,
) -> Result<(&'l str, RunSpec), SimError> {
    let mut parts = label.split('+');
    let base = parts.next().unwrap_or_default();
    let mut run = RunSpec::default();
    let bad = |why: String| SimError::input(format!("strategy {label:?}"), why);
    for suffix in parts {
        let (name, value) = match suffix.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (suffix, None),
        };
        match name {
            "hedge" => {
                let spec = value.unwrap_or_else(|| {
                    scenario
                        .and_then(|s| s.workload.hedge.as_deref())
                        .unwrap_or("p95")
                });
                let delay = spec
                    .parse::<HedgeDelay>()
                    .map_err(|why| bad(format!("hedge delay {why}")))?;
                run.hedge = Some(delay);
            }
            "aperture" | "subset" => {
                let size: u32 = value
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad(format!("write +{name}=N with N >= 1")))?;
                let mode = if name == "aperture" {
                    ApertureMode::Deterministic
                } else {
                    ApertureMode::Random
                };
                run.aperture = Some((mode, size));
            }
            _ => {
                return Err(bad(format!(
                "unknown suffix +{name} (expected +hedge, +hedge=DELAY, +aperture=N or +subset=N)"
            )))
            }
        }
    }
    Ok((base, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_in_any_order() {
        let (base, run) = split_run("p2c-ewma:x=1+subset=12+hedge=20ms", None).unwrap();
        assert_eq!(base, "p2c-ewma:x=1");
        assert_eq!(run.aperture, Some((ApertureMode::Random, 12)));
        assert!(run.hedge.is_some());
        let (_, run) = split_run("round-robin+aperture=8", None).unwrap();
        assert_eq!(run.aperture, Some((ApertureMode::Deterministic, 8)));
        assert!(split_run("random+aperture", None).is_err());
        assert!(split_run("random+aperture=0", None).is_err());
        assert!(split_run("random+sideways", None).is_err());
        assert!(split_run("random+hedgehog", None).is_err());
    }
}
