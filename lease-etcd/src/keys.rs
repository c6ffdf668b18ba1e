//! Where everything lives in etcd, under the URL's prefix `P`:
//!
//! | key | holds |
//! |---|---|
//! | `P/n/<node>` | the node's record, attached to its session's etcd lease |
//! | `P/g/<group>/meta` | the group's count, generation and previous count |
//! | `P/g/<group>/v` | the change counter: its `mod_revision` stamps views; watched for wake-ups |
//! | `P/g/<group>/m/<node>` | a member |
//! | `P/g/<group>/c/<node>` | an operator's control of a node |
//! | `P/g/<group>/b/<bucket>` | a bucket of the current generation (absent: unowned, never held) |
//! | `P/g/<group>/o/<bucket>` | a bucket of the draining generation |
//! | `P/g/<group>/t/<bucket>/<slot>` | the bucket's history ring |
//!
//! Group names are hex-encoded (any name, no `/` inside, and no group's keys are a prefix of
//! another's); bucket numbers are 10 decimal digits, so a range read returns them in order.

use lease_core::{Bucket, GroupName, WorkerId};

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
    pub fn node(&self, node: WorkerId) -> String {
        format!("{}{node}", self.nodes())
    }

    /// The node a key from [`nodes`](Self::nodes) is of.
    pub fn node_of(&self, key: &str) -> Option<WorkerId> {
        key.strip_prefix(&self.nodes())?.parse().ok()
    }

    /// Every key of `group` starts with this.
    pub fn group(&self, group: &GroupName) -> String {
        format!("{}/g/{}/", self.prefix, hex(group.as_str()))
    }

    /// The group's count, generation and previous count.
    pub fn meta(&self, group: &GroupName) -> String {
        format!("{}meta", self.group(group))
    }

    /// The group's change counter.
    pub fn version(&self, group: &GroupName) -> String {
        format!("{}v", self.group(group))
    }

    /// Every member key of `group` starts with this.
    pub fn members(&self, group: &GroupName) -> String {
        format!("{}m/", self.group(group))
    }

    /// A member of `group`.
    pub fn member(&self, group: &GroupName, node: WorkerId) -> String {
        format!("{}{node}", self.members(group))
    }

    /// The node a key from [`members`](Self::members) is of.
    pub fn member_of(&self, group: &GroupName, key: &str) -> Option<WorkerId> {
        key.strip_prefix(&self.members(group))?.parse().ok()
    }

    /// Every control key of `group` starts with this.
    pub fn controls(&self, group: &GroupName) -> String {
        format!("{}c/", self.group(group))
    }

    /// An operator's control of `node` in `group`.
    pub fn control(&self, group: &GroupName, node: WorkerId) -> String {
        format!("{}{node}", self.controls(group))
    }

    /// Every bucket key of `group`'s current generation starts with this.
    pub fn buckets(&self, group: &GroupName) -> String {
        format!("{}b/", self.group(group))
    }

    /// A bucket of the current generation.
    pub fn bucket(&self, group: &GroupName, bucket: Bucket) -> String {
        format!("{}{:010}", self.buckets(group), bucket.get())
    }

    /// The bucket a key from [`buckets`](Self::buckets) (or [`old_buckets`](Self::old_buckets),
    /// with that prefix) is of.
    pub fn bucket_of(prefix: &str, key: &str) -> Option<Bucket> {
        let digits = key.strip_prefix(prefix)?;
        if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().map(Bucket)
    }

    /// Every bucket key of `group`'s draining generation starts with this.
    pub fn old_buckets(&self, group: &GroupName) -> String {
        format!("{}o/", self.group(group))
    }

    /// A bucket of the draining generation.
    pub fn old_bucket(&self, group: &GroupName, bucket: Bucket) -> String {
        format!("{}{:010}", self.old_buckets(group), bucket.get())
    }

    /// Every history key of `bucket` starts with this.
    pub fn tenures(&self, group: &GroupName, bucket: Bucket) -> String {
        format!("{}t/{:010}/", self.group(group), bucket.get())
    }

    /// One slot of `bucket`'s history ring.
    pub fn tenure(&self, group: &GroupName, bucket: Bucket, slot: usize) -> String {
        format!("{}{slot}", self.tenures(group, bucket))
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
        assert_eq!(k.meta(&g("a")), "lease/g/61/meta");
    }

    #[test]
    fn bucket_keys_sort_by_number_and_parse_back() {
        let k = Keys::new("p");
        let orders = g("orders");
        let mut keys: Vec<String> = [65_535, 0, 10, 9, 100]
            .into_iter()
            .map(|b| k.bucket(&orders, Bucket(b)))
            .collect();
        keys.sort();
        let back: Vec<u32> = keys
            .iter()
            .filter_map(|key| Keys::bucket_of(&k.buckets(&orders), key))
            .map(|b| b.get())
            .collect();
        assert_eq!(back, [0, 9, 10, 100, 65_535]);
        assert_eq!(Keys::bucket_of(&k.buckets(&orders), &k.meta(&orders)), None);
        assert_eq!(Keys::bucket_of(&k.buckets(&orders), "p/g/6f/b/12"), None);
        let old = k.old_bucket(&orders, Bucket(7));
        assert_eq!(
            Keys::bucket_of(&k.old_buckets(&orders), &old),
            Some(Bucket(7))
        );
        assert!(
            k.tenure(&orders, Bucket(7), 3)
                .starts_with(&k.tenures(&orders, Bucket(7)))
        );
    }

    #[test]
    fn nodes_and_members_parse_back() {
        let k = Keys::new("p");
        let w = WorkerId::new();
        assert_eq!(k.node_of(&k.node(w)), Some(w));
        assert_eq!(k.member_of(&g("x"), &k.member(&g("x"), w)), Some(w));
        assert_eq!(k.member_of(&g("y"), &k.member(&g("x"), w)), None);
        assert_eq!(k.node_of("p/n/not-a-uuid"), None);
    }

    #[test]
    fn range_ends_cover_exactly_the_prefix() {
        assert_eq!(range_end("p/g/61/"), b"p/g/610".to_vec());
        assert_eq!(range_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }
}
