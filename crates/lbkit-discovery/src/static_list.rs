//! Static endpoint lists: `ADDRESS[=WEIGHT]`, comma-separated (`lbkit pick --endpoints`).

use lbkit_core::EndpointSpec;

use crate::address::check_address;
use crate::error::SourceError;

/// Parse `a:1=200,b:1,c:1=0`; `origin` names the input in errors.
///
/// # Errors
/// An empty list, a malformed address or weight, a duplicate address.
///
/// ```
/// let specs = lbkit_discovery::parse_static_list("10.0.0.1:80=5,10.0.0.2:80", "--endpoints").unwrap();
/// assert_eq!((specs[0].weight, specs[1].weight), (5, 100));
/// ```
pub fn parse_static_list(text: &str, origin: &str) -> Result<Vec<EndpointSpec>, SourceError> {
    let mut specs: Vec<EndpointSpec> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(SourceError::new(
                origin,
                None,
                format!("empty entry in {text:?}"),
            ));
        }
        let (address, weight) = match item.split_once('=') {
            Some((a, w)) => {
                let w = w.trim().parse::<u32>().map_err(|_| {
                    SourceError::new(
                        origin,
                        None,
                        format!("bad weight {w:?} for {a} (expected 0-4294967295)"),
                    )
                })?;
                (a.trim(), w)
            }
            None => (item, lbkit_core::DEFAULT_WEIGHT),
        };
        check_address(address).map_err(|r| SourceError::new(origin, None, r))?;
        if specs.iter().any(|s| s.address == address) {
            return Err(SourceError::new(
                origin,
                None,
                format!("duplicate address {address}"),
            ));
        }
        specs.push(EndpointSpec::new(address).with_weight(weight));
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors() {
        for (bad, want) in [
            ("", "empty entry"),
            ("a:1,,b:1", "empty entry"),
            ("a:1=x", "bad weight \"x\" for a:1"),
            ("a:1=-2", "bad weight"),
            ("a=3", "has no port"),
            ("a:1,a:1", "duplicate address a:1"),
        ] {
            let e = parse_static_list(bad, "--endpoints")
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("--endpoints: ") && e.contains(want),
                "{bad:?}: {e}"
            );
        }
    }
}
