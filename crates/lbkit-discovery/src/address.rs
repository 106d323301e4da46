//! `host:port` validation shared by every source.

/// Check that `address` is `host:port` (IPv6 hosts in brackets) with a port in 1..=65535.
///
/// # Errors
/// A message naming what is wrong.
///
/// ```
/// use lbkit_discovery::check_address;
/// assert!(check_address("10.0.0.1:20880").is_ok());
/// assert!(check_address("[::1]:80").is_ok());
/// assert!(check_address("10.0.0.1").is_err());
/// ```
pub fn check_address(address: &str) -> Result<(), String> {
    if address.is_empty() {
        return Err("empty address".into());
    }
    if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("address {address:?} contains white space"));
    }
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("address {address:?} has no port (expected host:port)"))?;
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').is_some_and(|h| !h.is_empty()),
        None => !host.is_empty() && !host.contains(':'),
    };
    if !host_ok {
        return Err(format!(
            "address {address:?} has no valid host (expected host:port, IPv6 as [addr]:port)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!(
            "address {address:?} has an invalid port {port:?} (expected 1-65535)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects() {
        for bad in [
            "", ":80", "a:", "a:0", "a:70000", "a b:1", "::1:80", "[]:1", "a:x",
        ] {
            assert!(check_address(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a:1", "svc.local:65535", "[fe80::1]:20880"] {
            assert!(check_address(good).is_ok(), "{good:?} rejected");
        }
    }
}
