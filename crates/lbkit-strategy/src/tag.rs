//! Where a request's routing tag is read (Dubbo's tag routing, [`lbkit_core::route`]): two
//! headers, which are also gRPC metadata keys. Dubbo's Triple consumers send their
//! `dubbo.tag` and `dubbo.force.tag` attachments as exactly these.

use lbkit_core::RequestTag;

use crate::hash::KeySource;

/// The request headers that carry the tag and its force flag, and the tag of requests that
/// carry none (a Dubbo consumer's own `dubbo.tag` parameter).
///
/// ```
/// use lbkit_strategy::{KeySource, TagHeaders};
/// struct Headers;
/// impl KeySource for Headers {
///     fn header(&self, name: &str) -> Option<&[u8]> {
///         (name == "dubbo.tag").then_some(b"gray".as_slice())
///     }
/// }
/// let headers = TagHeaders::default();
/// let tag = headers.read(&Headers).unwrap();
/// assert_eq!((tag.name, tag.force), (b"gray".as_slice(), false));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagHeaders {
    tag: String,
    force: String,
    default: Option<String>,
    default_force: bool,
}

impl Default for TagHeaders {
    fn default() -> Self {
        TagHeaders {
            tag: lbkit_core::route::TAG_KEY.to_owned(),
            force: lbkit_core::route::FORCE_TAG_KEY.to_owned(),
            default: None,
            default_force: false,
        }
    }
}

// === impl TagHeaders ===

impl TagHeaders {
    /// The tag in header `tag`, forced by `force: true` in header `force` (names
    /// case-insensitive; stored lowercase, as [`KeySource::header`] expects them).
    pub fn new(tag: &str, force: &str) -> Self {
        TagHeaders {
            tag: tag.to_ascii_lowercase(),
            force: force.to_ascii_lowercase(),
            ..TagHeaders::default()
        }
    }

    /// The tag of requests without one, and whether it is forced (unless the request says).
    pub fn with_default(mut self, tag: Option<String>, force: bool) -> Self {
        self.default = tag.filter(|t| !t.is_empty());
        self.default_force = force;
        self
    }

    /// The header that carries the tag.
    pub fn tag_header(&self) -> &str {
        &self.tag
    }

    /// The header that carries the force flag.
    pub fn force_header(&self) -> &str {
        &self.force
    }

    /// The request's tag: its header's (an empty one is none), else the default. Forced when
    /// the force header says `true` (any case: Java's `Boolean.parseBoolean`), else as the
    /// default says.
    #[inline]
    pub fn read<'a>(&'a self, req: &'a impl KeySource) -> Option<RequestTag<'a>> {
        let name = req
            .header(&self.tag)
            .filter(|v| !v.is_empty())
            .or(self.default.as_deref().map(str::as_bytes))?;
        let force = match req.header(&self.force) {
            Some(v) => v.eq_ignore_ascii_case(b"true"),
            None => self.default_force,
        };
        Some(RequestTag { name, force })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct H(&'static [(&'static str, &'static [u8])]);
    impl KeySource for H {
        fn header(&self, name: &str) -> Option<&[u8]> {
            self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        }
    }

    #[test]
    fn reads_the_tag_its_force_and_the_default() {
        let t = TagHeaders::default();
        assert_eq!(t.read(&H(&[])), None);
        assert_eq!(t.read(&H(&[("dubbo.tag", b"")])), None);
        assert_eq!(
            t.read(&H(&[("dubbo.tag", b"gray"), ("dubbo.force.tag", b"TRUE")])),
            Some(RequestTag::forced(b"gray"))
        );
        assert_eq!(
            t.read(&H(&[("dubbo.tag", b"gray"), ("dubbo.force.tag", b"yes")])),
            Some(RequestTag::new(b"gray"))
        );
        let d = TagHeaders::new("X-Tag", "X-Force").with_default(Some("blue".into()), true);
        assert_eq!(d.read(&H(&[])), Some(RequestTag::forced(b"blue")));
        assert_eq!(
            d.read(&H(&[("x-tag", b"gray"), ("x-force", b"false")])),
            Some(RequestTag::new(b"gray"))
        );
    }
}
