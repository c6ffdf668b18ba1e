//! How the memory state's rows are written as etcd values: compact JSON, one document per
//! node, one per group and one per page of a generation's buckets. Decoding checks what it
//! reads; a value that does not decode is [`BackendFailure::Corrupt`](lease_core::BackendFailure)
//! (another program wrote under the prefix, or a newer release's format).

use std::collections::{BTreeMap, BTreeSet};

use chrono::DateTime;
use lease_core::{
    Bucket, Change, EndReason, FencingToken, Generation, GroupName, Incarnation, Load,
    MemberMetadata, MemberMode, NodeId, QuarantineReason, SessionId, ShardCount, Tenure, TenureEnd,
    Tenures, Timestamp,
};
use lease_rules::{BucketRow, GroupState, MemberRow, NodeRow};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why a value did not decode.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct DecodeError {
    what: &'static str,
    detail: String,
}

fn bad(what: &'static str, detail: impl ToString) -> DecodeError {
    DecodeError {
        what,
        detail: detail.to_string(),
    }
}

fn micros(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

fn time(us: i64) -> Result<Timestamp, DecodeError> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| bad("a time", us))
}

fn shards(n: u32) -> Result<ShardCount, DecodeError> {
    ShardCount::new(n).map_err(|e| bad("a shard count", e))
}

/// A node's record, at `P/n/<node>`.
#[derive(Serialize, Deserialize)]
struct NodeDoc {
    s: Uuid,
    i: Uuid,
    st: i64,
    hb: i64,
    ex: i64,
    md: String,
    ho: bool,
    g: Vec<String>,
    /// The etcd lease the session's liveness key is attached to (lease mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l: Option<i64>,
    /// The session's ttl in microseconds (lease mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<i64>,
}

/// What a node's record holds besides its row: its etcd lease (lease mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeExtra {
    /// The etcd lease its liveness key is attached to.
    pub lease: Option<i64>,
    /// The session's ttl, in microseconds.
    pub ttl: Option<i64>,
}

/// Encode a node row.
pub fn encode_node(row: &NodeRow, extra: NodeExtra) -> Vec<u8> {
    let doc = NodeDoc {
        s: row.session.as_uuid(),
        i: row.incarnation.as_uuid(),
        st: micros(row.started_at),
        hb: micros(row.heartbeat_at),
        ex: micros(row.expires_at),
        md: row.metadata.as_str().to_owned(),
        ho: row.handed_over,
        g: row.groups.iter().map(|g| g.as_str().to_owned()).collect(),
        l: extra.lease,
        t: extra.ttl,
    };
    // Serializing these types cannot fail (no maps with non-string keys, no floats).
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Decode a node row.
pub fn decode_node(bytes: &[u8]) -> Result<(NodeRow, NodeExtra), DecodeError> {
    let doc: NodeDoc = serde_json::from_slice(bytes).map_err(|e| bad("a node record", e))?;
    // A ttl is at most a day (`Ttl::MAX`); anything else is not ours.
    if doc.t.is_some_and(|t| !(1..=86_400_000_000).contains(&t)) {
        return Err(bad("a node record", "a ttl out of range"));
    }
    let groups = doc
        .g
        .into_iter()
        .map(|g| GroupName::new(g).map_err(|e| bad("a group name", e)))
        .collect::<Result<BTreeSet<_>, _>>()?;
    Ok((
        NodeRow {
            session: SessionId::from_uuid(doc.s),
            incarnation: Incarnation::from_uuid(doc.i),
            started_at: time(doc.st)?,
            heartbeat_at: time(doc.hb)?,
            expires_at: time(doc.ex)?,
            metadata: MemberMetadata::new(doc.md).map_err(|e| bad("node metadata", e))?,
            handed_over: doc.ho,
            groups,
            // etcd never fails over (its writes are a quorum's): one timeline.
            timeline: lease_rules::BASE_TIMELINE,
            crossed: None,
        },
        NodeExtra {
            lease: doc.l,
            ttl: doc.t,
        },
    ))
}

/// A member row: node, joined at, held, held of the draining generation.
type MemberDoc = (Uuid, i64, Vec<u32>, Vec<u32>);

/// A group's document, at `P/g/<group>/d`: everything but its buckets.
#[derive(Serialize, Deserialize)]
struct GroupDoc {
    n: u32,
    r#gen: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prev: Option<u32>,
    /// Whether the previous generation's pages are still read (it may drain).
    old: bool,
    ver: u64,
    m: Vec<MemberDoc>,
    c: Vec<(Uuid, u32, String)>,
    q: Vec<(u32, i64)>,
    /// Q5: the reasons of the quarantines that have one (absent in documents written before
    /// reasons were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    qr: Vec<(u32, String)>,
    /// P3: the members' work at their last publications (load, hottest), of those with one
    /// (absent in documents written before loads were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ml: Vec<(Uuid, u64, u64)>,
    /// The changes the write that stored this document sent (W1): what watchers deliver.
    ch: Vec<String>,
}

/// A group's document, decoded: the group without its buckets (`buckets` and `old` hold
/// default rows of the right lengths) and whether the draining generation is kept.
pub struct GroupHead {
    /// The group, its buckets to be read from the pages.
    pub state: GroupState,
    /// Whether the previous generation's pages are to be read.
    pub old: bool,
    /// The changes the write that stored it sent.
    pub changes: Vec<Change>,
}

/// Encode a group's document, with the changes the write sends.
pub fn encode_group(g: &GroupState, changes: &[Change]) -> Vec<u8> {
    let doc = GroupDoc {
        n: g.shards.get(),
        r#gen: g.generation.get(),
        prev: g.previous.map(ShardCount::get),
        old: !g.old.is_empty(),
        ver: g.version,
        m: g.members
            .iter()
            .map(|(w, m)| {
                (
                    w.as_uuid(),
                    micros(m.joined_at),
                    m.held.iter().map(|b| b.0).collect(),
                    m.held_old.iter().map(|b| b.0).collect(),
                )
            })
            .collect(),
        c: g.controls
            .iter()
            .map(|(w, (weight, mode))| (w.as_uuid(), *weight, mode.as_str().to_owned()))
            .collect(),
        q: g.quarantines
            .iter()
            .map(|(b, t)| (b.0, micros(*t)))
            .collect(),
        qr: g
            .quarantine_reasons
            .iter()
            .map(|(b, r)| (b.0, r.as_str().to_owned()))
            .collect(),
        ml: g
            .members
            .iter()
            .filter(|(_, m)| m.load > 0 || m.hottest > Load::ZERO)
            .map(|(w, m)| (w.as_uuid(), m.load, m.hottest.micros()))
            .collect(),
        ch: changes.iter().filter_map(encode_change).collect(),
    };
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Decode a group's document.
pub fn decode_group(bytes: &[u8]) -> Result<GroupHead, DecodeError> {
    let doc: GroupDoc = serde_json::from_slice(bytes).map_err(|e| bad("a group document", e))?;
    let work: BTreeMap<Uuid, (u64, u64)> = doc.ml.iter().map(|&(w, l, h)| (w, (l, h))).collect();
    let members = doc
        .m
        .into_iter()
        .map(|(w, joined, held, held_old)| {
            let (load, hottest) = work.get(&w).copied().unwrap_or_default();
            Ok((
                NodeId::from_uuid(w),
                MemberRow {
                    joined_at: time(joined)?,
                    held: held.into_iter().map(Bucket).collect(),
                    held_old: held_old.into_iter().map(Bucket).collect(),
                    load,
                    hottest: load_of(hottest)?,
                },
            ))
        })
        .collect::<Result<BTreeMap<_, _>, DecodeError>>()?;
    let controls = doc
        .c
        .into_iter()
        .map(|(w, weight, mode)| {
            let mode = MemberMode::from_name(&mode).ok_or_else(|| bad("a member mode", &mode))?;
            Ok((NodeId::from_uuid(w), (weight, mode)))
        })
        .collect::<Result<BTreeMap<_, _>, DecodeError>>()?;
    let quarantines = doc
        .q
        .into_iter()
        .map(|(b, t)| Ok((Bucket(b), time(t)?)))
        .collect::<Result<BTreeMap<_, _>, DecodeError>>()?;
    let quarantine_reasons = doc
        .qr
        .into_iter()
        .map(|(b, r)| {
            let reason = QuarantineReason::new(r).map_err(|e| bad("a quarantine's reason", e))?;
            Ok((Bucket(b), reason))
        })
        .collect::<Result<BTreeMap<_, _>, DecodeError>>()?;
    let count = shards(doc.n)?;
    let previous = doc.prev.map(shards).transpose()?;
    let old_len = match (doc.old, previous) {
        (true, Some(p)) => p.get() as usize,
        (true, None) => {
            return Err(bad(
                "a group document",
                "a draining generation with no count",
            ));
        }
        (false, _) => 0,
    };
    // Bucket numbers index the generations' rows: one out of range is not ours.
    let out_of_range = members.values().any(|m| {
        m.held.iter().any(|b| b.0 >= count.get())
            || m.held_old.iter().any(|b| b.0 as usize >= old_len)
    }) || quarantines.keys().any(|b| b.0 >= count.get());
    if out_of_range {
        return Err(bad(
            "a group document",
            "a bucket out of its generation's range",
        ));
    }
    if quarantine_reasons
        .keys()
        .any(|b| !quarantines.contains_key(b))
    {
        return Err(bad(
            "a group document",
            "a quarantine's reason with no quarantine",
        ));
    }
    Ok(GroupHead {
        state: GroupState {
            shards: count,
            buckets: vec![BucketRow::default(); count.get() as usize],
            members,
            generation: Generation(doc.r#gen),
            previous,
            old: vec![BucketRow::default(); old_len],
            version: doc.ver,
            controls,
            quarantines,
            quarantine_reasons,
        },
        old: doc.old,
        changes: doc.ch.iter().filter_map(|c| decode_change(c)).collect(),
    })
}

fn encode_change(change: &Change) -> Option<String> {
    Some(match change {
        Change::Joined(w) => format!("j{w}"),
        Change::Left(w) => format!("l{w}"),
        Change::Released(w) => format!("r{w}"),
        Change::Resized => "z".to_owned(),
        Change::Controlled => "c".to_owned(),
        // Not a change an operation sends; and `Change` may grow.
        _ => return None,
    })
}

fn decode_change(text: &str) -> Option<Change> {
    let (kind, rest) = text.split_at_checked(1)?;
    let worker = || rest.parse::<NodeId>().ok();
    Some(match kind {
        "j" => Change::Joined(worker()?),
        "l" => Change::Left(worker()?),
        "r" => Change::Released(worker()?),
        "z" => Change::Resized,
        "c" => Change::Controlled,
        // A newer release's change: a wake-up all the same.
        _ => Change::Missed,
    })
}

/// The changes a group document a watcher saw carries ([`Change::Missed`] if it does not
/// decode: something changed, and the worker re-plans).
pub fn changes_of(bytes: &[u8]) -> Vec<Change> {
    decode_group(bytes).map_or_else(|_| vec![Change::Missed], |h| h.changes)
}

/// A tenure: owner, token, began, and its end (at, reason).
type TenureDoc = (Uuid, i64, i64, Option<(i64, String)>);

/// A bucket row: owner (node, session), token, last node, tenures, and its load (P4; absent
/// in pages written before loads were kept).
#[derive(Serialize, Deserialize)]
struct RowDoc(
    Option<(Uuid, Uuid)>,
    i64,
    Option<Uuid>,
    Vec<TenureDoc>,
    #[serde(default)] u64,
);

/// Encode a page of bucket rows.
pub fn encode_page(rows: &[BucketRow]) -> Vec<u8> {
    let docs: Vec<RowDoc> = rows
        .iter()
        .map(|r| {
            RowDoc(
                r.owner.map(|(w, s)| (w.as_uuid(), s.as_uuid())),
                r.token,
                r.last_node.map(|w| w.as_uuid()),
                r.tenures
                    .to_vec()
                    .into_iter()
                    .map(|t| {
                        (
                            t.owner.as_uuid(),
                            t.token.0,
                            micros(t.began_at),
                            t.ended
                                .map(|e| (micros(e.at), e.reason.as_str().to_owned())),
                        )
                    })
                    .collect(),
                r.load.micros(),
            )
        })
        .collect();
    serde_json::to_vec(&docs).unwrap_or_default()
}

/// Decode a page of bucket rows.
pub fn decode_page(bytes: &[u8]) -> Result<Vec<BucketRow>, DecodeError> {
    let docs: Vec<RowDoc> = serde_json::from_slice(bytes).map_err(|e| bad("a bucket page", e))?;
    docs.into_iter()
        .map(|RowDoc(owner, token, last, tenures, load)| {
            let tenures = tenures
                .into_iter()
                .map(|(owner, token, began, ended)| {
                    Ok(Tenure {
                        owner: NodeId::from_uuid(owner),
                        token: FencingToken(token),
                        began_at: time(began)?,
                        ended: ended
                            .map(|(at, reason)| {
                                Ok::<_, DecodeError>(TenureEnd {
                                    at: time(at)?,
                                    reason: EndReason::from_name(&reason)
                                        .ok_or_else(|| bad("an end reason", &reason))?,
                                })
                            })
                            .transpose()?,
                    })
                })
                .collect::<Result<Vec<_>, DecodeError>>()?;
            Ok(BucketRow {
                owner: owner.map(|(w, s)| (NodeId::from_uuid(w), SessionId::from_uuid(s))),
                token,
                last_node: last.map(NodeId::from_uuid),
                tenures: Tenures::from(tenures),
                load: load_of(load)?,
            })
        })
        .collect()
}

/// A load as stored: whole millionths, at most [`Load::MAX`].
fn load_of(micros: u64) -> Result<Load, DecodeError> {
    if micros > Load::MAX.micros() {
        return Err(bad("a load", micros));
    }
    Ok(Load::from_micros(micros))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use lease_core::Generation;

    fn at(s: i64) -> Timestamp {
        chrono::Utc
            .timestamp_opt(1_800_000_000 + s, 0)
            .single()
            .expect("a time")
    }

    fn node() -> NodeRow {
        NodeRow {
            session: SessionId::new(),
            incarnation: Incarnation::new(),
            started_at: at(0),
            heartbeat_at: at(1),
            expires_at: at(11),
            metadata: MemberMetadata::new("it's \"odd\"; é").expect("metadata"),
            handed_over: true,
            groups: [GroupName::new("a/b").expect("a name")].into(),
            timeline: lease_rules::BASE_TIMELINE,
            crossed: None,
        }
    }

    fn group() -> GroupState {
        let w = NodeId::new();
        let mut buckets = vec![BucketRow::default(); 4];
        buckets[2].owner = Some((w, SessionId::new()));
        buckets[2].token = 7;
        buckets[2].last_node = Some(w);
        buckets[2].tenures.begin(w, FencingToken(7), at(3));
        buckets[2].tenures.end(at(4), EndReason::Drained);
        buckets[2].load = Load::from_micros(2_500_000);
        buckets[0].load = Load::from_micros(7);
        GroupState {
            shards: ShardCount::new(4).expect("a count"),
            buckets,
            members: [(
                w,
                MemberRow {
                    joined_at: at(2),
                    held: [Bucket(2)].into(),
                    held_old: [Bucket(1)].into(),
                    load: 2_500_000,
                    hottest: Load::from_micros(2_500_000),
                },
            )]
            .into(),
            generation: Generation(3),
            previous: ShardCount::new(2).ok(),
            old: vec![BucketRow::default(); 2],
            version: 9,
            controls: [(w, (3, MemberMode::Cordoned))].into(),
            quarantines: [(Bucket(3), at(60))].into(),
            quarantine_reasons: [(
                Bucket(3),
                QuarantineReason::new("exit code 3").expect("a reason"),
            )]
            .into(),
        }
    }

    #[test]
    fn rows_round_trip() {
        let n = node();
        let extra = NodeExtra {
            lease: Some(42),
            ttl: Some(3_000_000),
        };
        assert_eq!(
            decode_node(&encode_node(&n, extra)).expect("decodes"),
            (n, extra)
        );
        let g = group();
        let head = decode_group(&encode_group(&g, &[Change::Resized, Change::Controlled]))
            .expect("decodes");
        assert_eq!(head.changes, [Change::Resized, Change::Controlled]);
        assert!(head.old);
        let mut expected = g.clone();
        expected.buckets = vec![BucketRow::default(); 4];
        assert_eq!(
            head.state, expected,
            "the document holds all but the buckets"
        );
        assert_eq!(
            decode_page(&encode_page(&g.buckets)).expect("decodes"),
            g.buckets
        );
    }

    #[test]
    fn documents_of_the_previous_release_read_with_no_load() {
        let w = Uuid::from_u128(1);
        let page = format!(r#"[[["{w}","{w}"],3,"{w}",[]],[null,0,null,[]]]"#);
        let rows = decode_page(page.as_bytes()).expect("a page with no loads decodes");
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.load == Load::ZERO));
        let mut g = group();
        g.members.values_mut().for_each(|m| {
            m.load = 0;
            m.hottest = Load::ZERO;
        });
        let doc = String::from_utf8(encode_group(&g, &[])).expect("json");
        assert!(
            !doc.contains("\"ml\""),
            "no member loads written when none: {doc}"
        );
        let head = decode_group(doc.as_bytes()).expect("decodes");
        assert!(head.state.members.values().all(|m| m.load == 0));
    }

    #[test]
    fn foreign_values_are_refused_not_trusted() {
        let mut g = group();
        g.members.values_mut().for_each(|m| {
            m.held.insert(Bucket(4));
        });
        assert!(
            decode_group(&encode_group(&g, &[])).is_err(),
            "held beyond the count"
        );
        let mut g = group();
        g.quarantines.insert(Bucket(9), at(1));
        assert!(
            decode_group(&encode_group(&g, &[])).is_err(),
            "quarantine beyond the count"
        );
        let huge = NodeExtra {
            lease: Some(1),
            ttl: Some(i64::MAX),
        };
        assert!(
            decode_node(&encode_node(&node(), huge)).is_err(),
            "a ttl beyond a day"
        );
        assert!(decode_node(br#"{"s": 1}"#).is_err());
        assert!(decode_page(b"[[null, 1]]").is_err());
        assert_eq!(
            changes_of(b"not json"),
            [Change::Missed],
            "a wake-up all the same"
        );
    }
}
