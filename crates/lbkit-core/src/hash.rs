//! [`key_hash`]: the one hash of request and endpoint keys, a leaf module (endpoints, tried
//! sets and hash strategies all use it, and it uses none of them).

/// lbkit's default 64-bit hash of a request key (SipHash-2-4 with fixed keys: stable across
/// processes and versions of lbkit, so every client of a fleet hashes a key alike).
pub fn key_hash(key: &[u8]) -> u64 {
    use std::hash::Hasher;
    #[allow(deprecated)]
    // SipHasher is deprecated only in favour of DefaultHasher, whose output may change
    let mut h = std::hash::SipHasher::new_with_keys(0x6c62_6b69_745f_6b65, 0x795f_6861_7368_0002);
    h.write(key);
    h.finish()
}
