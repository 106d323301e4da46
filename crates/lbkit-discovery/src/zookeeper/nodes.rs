//! The provider nodes a consumer knows, indexed by the key they decode to, and the keys whose
//! provider may have changed since the consumer last sent its set: what lets a change of one
//! node among thousands cost O(log n) to send instead of a whole set (scale of configuration,
//! BENCHMARKS.md).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lbkit_core::{EndpointKey, EndpointSpec};

/// Provider nodes by name (the endpoint, or `None`: filtered out or malformed), with the names
/// behind each key (the first by name is the key's provider; the others are duplicates).
#[derive(Debug, Default)]
pub(super) struct Nodes {
    by_name: BTreeMap<String, Option<EndpointSpec>>,
    by_key: HashMap<EndpointKey, BTreeSet<String>, foldhash::fast::RandomState>,
    /// Keys whose provider may have changed since [`Nodes::take_touched`]; `None` (also at
    /// the start): any may have (a new listing, or a change that applies to every node).
    touched: Option<BTreeSet<EndpointKey>>,
}

impl Nodes {
    /// Node `name` now decodes to `spec`.
    pub(super) fn insert(&mut self, name: String, spec: Option<EndpointSpec>) {
        if let Some(Some(old)) = self.by_name.get(&name) {
            let key = old.key.clone();
            self.unindex(&key, &name);
        }
        if let Some(spec) = &spec {
            self.touch(&spec.key);
            self.by_key
                .entry(spec.key.clone())
                .or_default()
                .insert(name.clone());
        }
        self.by_name.insert(name, spec);
    }

    /// Node `name` is gone.
    pub(super) fn remove(&mut self, name: &str) {
        if let Some(Some(old)) = self.by_name.remove(name) {
            self.unindex(&old.key, name);
        }
    }

    /// A full listing replaces the nodes.
    pub(super) fn replace(&mut self, nodes: BTreeMap<String, Option<EndpointSpec>>) {
        self.by_key.clear();
        for (name, spec) in &nodes {
            if let Some(spec) = spec {
                self.by_key
                    .entry(spec.key.clone())
                    .or_default()
                    .insert(name.clone());
            }
        }
        self.by_name = nodes;
        self.touched = None;
    }

    /// Every node is gone (the directory was deleted).
    pub(super) fn clear(&mut self) {
        self.replace(BTreeMap::new());
    }

    /// The decoded nodes, in name order.
    pub(super) fn specs(&self) -> impl Iterator<Item = (&str, &EndpointSpec)> {
        self.by_name
            .iter()
            .filter_map(|(name, spec)| Some((name.as_str(), spec.as_ref()?)))
    }

    /// The provider of `key`: its first node by name, if any.
    pub(super) fn provider(&self, key: &EndpointKey) -> Option<(&str, &EndpointSpec)> {
        let name = self.by_key.get(key)?.first()?;
        let spec = self.by_name.get(name)?.as_ref()?;
        Some((name.as_str(), spec))
    }

    /// Something that applies to every node changed (override or tag rules): every key counts
    /// as touched.
    pub(super) fn touch_all(&mut self) {
        self.touched = None;
    }

    /// The keys touched since the last call (`None`: any may have been), and start afresh.
    pub(super) fn take_touched(&mut self) -> Option<BTreeSet<EndpointKey>> {
        self.touched.replace(BTreeSet::new())
    }

    fn touch(&mut self, key: &EndpointKey) {
        if let Some(touched) = &mut self.touched {
            touched.insert(key.clone());
        }
    }

    /// Node `name` no longer decodes to `key`.
    fn unindex(&mut self, key: &EndpointKey, name: &str) {
        self.touch(key);
        if let Some(names) = self.by_key.get_mut(key) {
            names.remove(name);
            if names.is_empty() {
                self.by_key.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(addr: &str, weight: u32) -> Option<EndpointSpec> {
        Some(EndpointSpec::new(addr).with_weight(weight))
    }

    fn keys(names: &[&str]) -> Option<BTreeSet<EndpointKey>> {
        Some(names.iter().map(|n| EndpointKey::from(*n)).collect())
    }

    fn provider(nodes: &Nodes, key: &str) -> Option<(String, u32)> {
        nodes
            .provider(&EndpointKey::from(key))
            .map(|(n, s)| (n.to_owned(), s.weight))
    }

    /// Duplicates: the first node by name provides a key, the next takes over when it goes;
    /// every change touches the keys it involves, and a listing or a rule change touches all.
    #[test]
    fn the_first_node_by_name_provides_its_key_and_changes_touch_their_keys() {
        let mut nodes = Nodes::default();
        nodes.replace(BTreeMap::from([
            ("n1".to_owned(), spec("a:1", 1)),
            ("n2".to_owned(), spec("b:1", 2)),
            ("n3".to_owned(), None),
        ]));
        assert_eq!(nodes.take_touched(), None, "a listing touches everything");
        assert_eq!(nodes.take_touched(), Some(BTreeSet::new()));

        nodes.insert("n0".to_owned(), spec("b:1", 3)); // a duplicate of b:1, first by name
        assert_eq!(provider(&nodes, "b:1"), Some(("n0".to_owned(), 3)));
        nodes.insert("n1".to_owned(), spec("c:1", 4)); // n1 moves from a:1 to c:1
        assert_eq!(provider(&nodes, "a:1"), None);
        assert_eq!(provider(&nodes, "c:1"), Some(("n1".to_owned(), 4)));
        assert_eq!(nodes.take_touched(), keys(&["a:1", "b:1", "c:1"]));

        nodes.remove("n0");
        assert_eq!(provider(&nodes, "b:1"), Some(("n2".to_owned(), 2)));
        nodes.insert("n2".to_owned(), None); // now malformed: b:1 has no provider left
        assert_eq!(provider(&nodes, "b:1"), None);
        nodes.remove("n3"); // never decoded: touches nothing
        nodes.remove("n9"); // unknown
        assert_eq!(nodes.take_touched(), keys(&["b:1"]));
        let listed: Vec<&str> = nodes.specs().map(|(n, _)| n).collect();
        assert_eq!(listed, ["n1"]);

        nodes.touch_all();
        assert_eq!(nodes.take_touched(), None);
        nodes.clear();
        assert_eq!(provider(&nodes, "c:1"), None);
        assert_eq!(nodes.take_touched(), None);
    }
}
