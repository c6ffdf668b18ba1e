//! Where everything lives in etcd, under the URL's prefix `P`:
//!
//! | key | holds |
//! |---|---|
//! | `P/n/<node>` | the node's record: its session, incarnation, times, metadata, groups |
//! | `P/l/<node>` | the session's liveness key, attached to its etcd lease (lease mode) |
//! | `P/g/<group>/d` | the group's document: count, generation, members, controls, quarantines, change counter |
//! | `P/g/<group>/p/<generation>/<page>` | a page of a generation's buckets (absent: never written, all unowned at token 0) |
//!
//! Group names are hex-encoded (any name, no `/` inside, and no group's keys are a prefix of
//! another's); generations are 20 and pages 10 decimal digits, so a range read returns them
//! in order.

use lease_core::{GroupName, NodeId};

/// The keys of one store (one prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (an [`EtcdUrl`](crate::EtcdUrl)'s, without a trailing `/`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// Every node record's key starts with this.
    pub fn nodes(&self) -> String {
        format!("{}/n/", self.prefix)
    }

    /// A node's record.
    pub fn node(&self, node: NodeId) -> String {
        format!("{}{node}", self.nodes())
    }

    /// The node a key from [`nodes`](Self::nodes) is of.
    pub fn node_of(&self, key: &str) -> Option<NodeId> {
        key.strip_prefix(&self.nodes())?.parse().ok()
    }

    /// Every liveness key starts with this.
    pub fn lives(&self) -> String {
        format!("{}/l/", self.prefix)
    }

    /// A node's liveness key.
    pub fn live(&self, node: NodeId) -> String {
        format!("{}{node}", self.lives())
    }

    /// The node a key from [`lives`](Self::lives) is of.
    pub fn live_of(&self, key: &str) -> Option<NodeId> {
        key.strip_prefix(&self.lives())?.parse().ok()
    }

    /// Every key of `group` starts with this.
    pub fn group(&self, group: &GroupName) -> String {
        format!("{}/g/{}/", self.prefix, hex(group.as_str()))
    }

    /// The group's document.
    pub fn doc(&self, group: &GroupName) -> String {
        format!("{}d", self.group(group))
    }

    /// Every page of `generation` starts with this.
    pub fn pages(&self, group: &GroupName, generation: u64) -> String {
        format!("{}p/{generation:020}/", self.group(group))
    }

    /// A page of `generation`'s buckets.
    pub fn page(&self, group: &GroupName, generation: u64, page: usize) -> String {
        format!("{}{page:010}", self.pages(group, generation))
    }

    /// The generation and page a key of `group` names, if it is a page's.
    pub fn page_of(&self, group: &GroupName, key: &str) -> Option<(u64, usize)> {
        let rest = key.strip_prefix(&format!("{}p/", self.group(group)))?;
        let (generation, page) = rest.split_once('/')?;
        let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(generation, 20) || !digits(page, 10) {
            return None;
        }
        Some((generation.parse().ok()?, page.parse().ok()?))
    }
}

/// The end of the range of every key starting with `prefix` (etcd's `range_end`): the prefix
/// with its last byte raised by one.
pub fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: the range runs to the end of the keyspace.
    vec![0]
}

fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(name: &str) -> GroupName {
        GroupName::new(name).expect("a valid name")
    }

    #[test]
    fn groups_never_share_a_prefix() {
        let k = Keys::new("lease/");
        let names = [
            "a",
            "a/b",
            "ab",
            "it's \"odd\"; DROP TABLE lease.shards; --",
            "é",
        ];
        for x in names {
            assert!(!k.group(&g(x)).contains("//"));
            for y in names {
                if x != y {
                    assert!(
                        !k.group(&g(y)).starts_with(&k.group(&g(x))),
                        "{x:?} is a prefix of {y:?}"
                    );
                }
            }
        }
        assert_eq!(k.doc(&g("a")), "lease/g/61/d");
    }

    #[test]
    fn page_keys_sort_by_number_and_parse_back() {
        let k = Keys::new("p");
        let orders = g("orders");
        let mut keys: Vec<String> = [(2, 0), (1, 10), (1, 9), (10, 0), (1, 100)]
            .into_iter()
            .map(|(generation, page)| k.page(&orders, generation, page))
            .collect();
        keys.sort();
        let back: Vec<(u64, usize)> = keys
            .iter()
            .filter_map(|key| k.page_of(&orders, key))
            .collect();
        assert_eq!(back, [(1, 9), (1, 10), (1, 100), (2, 0), (10, 0)]);
        assert_eq!(k.page_of(&orders, &k.doc(&orders)), None);
        assert_eq!(k.page_of(&orders, "p/g/6f726465727$/p/1/2"), None);
        assert!(k.page(&orders, 3, 1).starts_with(&k.pages(&orders, 3)));
        assert_eq!(k.page_of(&g("other"), &k.page(&orders, 3, 1)), None);
    }

    #[test]
    fn nodes_and_liveness_keys_parse_back() {
        let k = Keys::new("p");
        let w = NodeId::new();
        assert_eq!(k.node_of(&k.node(w)), Some(w));
        assert_eq!(k.live_of(&k.live(w)), Some(w));
        assert_eq!(k.node_of(&k.live(w)), None);
        assert_eq!(k.node_of("p/n/not-a-uuid"), None);
    }

    #[test]
    fn range_ends_cover_exactly_the_prefix() {
        assert_eq!(range_end("p/g/61/"), b"p/g/610".to_vec());
        assert_eq!(range_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }
}
