//! Request attributes for metadata subsets ([`lbkit_core::stage`]), read from headers (gRPC
//! metadata arrives as headers too): one rule for `lbkit-tower` and `lbkit proxy`.

use lbkit_core::stage::Attr;

use crate::KeySource;

/// Most attributes read from one request.
pub const MAX_ATTRS: usize = 16;

/// Which header carries each subset key's value.
///
/// ```
/// use lbkit_strategy::{AttrHeaders, KeySource};
/// struct H;
/// impl KeySource for H {
///     fn header(&self, name: &str) -> Option<&[u8]> {
///         (name == "x-version").then_some(b"v2".as_slice())
///     }
/// }
/// let attrs = AttrHeaders::new([("version", "X-Version"), ("zone", "x-zone")]);
/// let seen = attrs.with_attrs(&H, |a| {
///     a.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect::<Vec<_>>()
/// });
/// assert_eq!(seen, vec![(b"version".to_vec(), b"v2".to_vec())]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttrHeaders {
    /// (subset key, lowercase header name), at most [`MAX_ATTRS`].
    pairs: Vec<(String, String)>,
}

impl AttrHeaders {
    /// Read key `k` from header `h` for each pair (names case-insensitive); pairs past
    /// [`MAX_ATTRS`] are ignored (config validation refuses them first).
    pub fn new<K: Into<String>, H: AsRef<str>>(pairs: impl IntoIterator<Item = (K, H)>) -> Self {
        AttrHeaders {
            pairs: pairs
                .into_iter()
                .take(MAX_ATTRS)
                .map(|(k, h)| (k.into(), h.as_ref().to_ascii_lowercase()))
                .collect(),
        }
    }

    /// Each key from the header of the same name (gRPC metadata keys are header names).
    pub fn same_names<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Self {
        AttrHeaders::new(keys.into_iter().map(|k| {
            let k = k.as_ref().to_owned();
            (k.clone(), k)
        }))
    }

    /// The (key, header) pairs.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Whether no attribute is read.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Call `f` with the attributes `req` carries (no allocation: a stack array).
    #[inline]
    pub fn with_attrs<R>(&self, req: &impl KeySource, f: impl FnOnce(&[Attr<'_>]) -> R) -> R {
        let mut buf: [Attr<'_>; MAX_ATTRS] = [(&[], &[]); MAX_ATTRS];
        let mut n = 0;
        for (key, header) in &self.pairs {
            if let Some(v) = req.header(header) {
                buf[n] = (key.as_bytes(), v);
                n += 1;
            }
        }
        f(&buf[..n])
    }
}

/// Attributes read from a request and kept past its headers' borrow (the proxy's requests are
/// read once, then picked for across `.await`s): allocates only when the request carries some.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedAttrs(Vec<(Bytes, Bytes)>);

/// Owned bytes of a key or value.
type Bytes = Box<[u8]>;

impl AttrHeaders {
    /// The attributes of `req`, owned.
    pub fn read_owned(&self, req: &impl KeySource) -> OwnedAttrs {
        if self.pairs.is_empty() {
            return OwnedAttrs::default();
        }
        self.with_attrs(req, |attrs| {
            OwnedAttrs(
                attrs
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            )
        })
    }
}

impl OwnedAttrs {
    /// The attributes, viewed through `buf` (a stack array the caller keeps for the pick).
    pub fn view<'a>(&'a self, buf: &'a mut [Attr<'a>; MAX_ATTRS]) -> &'a [Attr<'a>] {
        let n = self.0.len().min(MAX_ATTRS);
        for (slot, (k, v)) in buf.iter_mut().zip(&self.0) {
            *slot = (k, v);
        }
        &buf[..n]
    }
}

/// An empty buffer for [`OwnedAttrs::view`].
#[inline]
pub fn attr_buf<'a>() -> [Attr<'a>; MAX_ATTRS] {
    [(&[], &[]); MAX_ATTRS]
}
