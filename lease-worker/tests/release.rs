//! Releases in batches, with explicit time: a node letting go of more buckets than one release
//! may name (a shed of 6,000 buckets when a second member shows up in a group of 12,000) sends
//! them in calls of at most `RELEASE_BATCH`, one after another within the tick, until every
//! acknowledged bucket is released. One call for all of them could outlast the call timeout
//! on a real store, where an abandoned call is cancelled and would never finish.

mod admission;
use admission::admit;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease_core::{
    Bucket, FencingToken, GroupBeat, GroupName, GroupView, Heartbeat, Incarnation, Lease,
    MemberLoad, NodeId, SessionId, ShardCount, Ttl, ViewStamp,
};
use lease_worker::machine::{Delivery, Input, Machine, Output, RELEASE_BATCH, Rules, StoreCall};
use uuid::Uuid;

const BUCKETS: u32 = 12_000;

fn me() -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(1))
}

fn peer() -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(2))
}

fn group() -> GroupName {
    GroupName::new("orders").expect("a group name")
}

fn count() -> ShardCount {
    ShardCount::new(BUCKETS).expect("a count")
}

/// The node and a store that answers at once; the application acknowledges each revocation
/// as it comes.
struct World {
    m: Machine,
    now: Instant,
    base: DateTime<Utc>,
    member: bool,
    held: BTreeSet<Bucket>,
    first_beat: bool,
    /// Whether the second member has shown up.
    peer: bool,
    releases: Vec<usize>,
    ticks: usize,
}

impl World {
    fn new() -> Self {
        let now = Instant::now();
        let rules = Rules {
            node: me(),
            incarnation: Incarnation::new(),
            metadata: lease_core::MemberMetadata::default(),
            ttl: Ttl::new(Duration::from_secs(30)).expect("ttl"),
            renew_interval: Duration::from_secs(10),
            safety_margin: Duration::from_secs(2),
            wake_debounce: Duration::from_millis(10),
            call_timeout: Duration::from_secs(5),
            ack_limit: None,
            keep_on_stop: None,
            loads: Default::default(),
        };
        let mut m = Machine::new(rules, now);
        admit(&mut m, now, group(), count());
        Self {
            m,
            now,
            base: DateTime::UNIX_EPOCH + chrono::TimeDelta::days(20_000),
            member: false,
            held: BTreeSet::new(),
            first_beat: true,
            peer: false,
            releases: Vec::new(),
            ticks: 0,
        }
    }

    fn beat(&mut self) -> Input {
        self.ticks += 1;
        let lease = |bucket| Lease {
            bucket,
            shards: count(),
            owner: me(),
            token: FencingToken(1),
            expires_at: self.base,
        };
        let mut members = vec![MemberLoad::new(me(), self.held.len() as u32)];
        if self.peer {
            members.push(MemberLoad::new(peer(), 0));
        }
        let groups = if self.member {
            vec![GroupBeat {
                group: group(),
                view: GroupView::new(count(), members, BUCKETS - self.held.len() as u32),
                owned: self.held.iter().map(|&b| lease(b)).collect(),
                stamp: ViewStamp::new(self.ticks as u64, None),
                quarantined: Vec::new(),
            }]
        } else {
            Vec::new()
        };
        Input::Heartbeat(Ok(Heartbeat {
            session: SessionId::from_uuid(Uuid::from_u128(7)),
            new_session: std::mem::take(&mut self.first_beat),
            observed_at: self.base,
            expires_at: self.base,
            groups,
            unchanged: Vec::new(),
            position: None,
        }))
    }

    /// Everything the machine does by `now`, the store and the application answering at once.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            let Some(out) = self.m.poll(self.now) else {
                match self.m.poll_timeout() {
                    Some(t) if t <= self.now => {
                        self.m.handle_timeout(self.now);
                        continue;
                    }
                    _ => return,
                }
            };
            let input = match out {
                Output::Call(StoreCall::Heartbeat { .. }) => self.beat(),
                Output::Call(StoreCall::Join { group, .. }) => {
                    self.member = true;
                    Input::Joined(group, Ok(()))
                }
                Output::Call(StoreCall::Claim { group, want, .. }) => {
                    let won: Vec<Lease> = (0..BUCKETS)
                        .map(Bucket)
                        .filter(|b| !self.held.contains(b))
                        .take(want as usize)
                        .map(|bucket| Lease {
                            bucket,
                            shards: count(),
                            owner: me(),
                            token: FencingToken(1),
                            expires_at: self.base,
                        })
                        .collect();
                    self.held.extend(won.iter().map(|l| l.bucket));
                    Input::Claimed(group, Ok(won))
                }
                Output::Call(StoreCall::Release { group, buckets, .. }) => {
                    self.releases.push(buckets.len());
                    let released = buckets
                        .into_iter()
                        .filter(|b| self.held.remove(b))
                        .collect();
                    Input::Released(group, Ok(released))
                }
                Output::Call(other) => panic!("unexpected call {other:?}"),
                Output::Deliver(group, Delivery::Assign { .. }) => Input::Delivered(group),
                Output::Deliver(group, Delivery::Revoke { bucket, .. }) => {
                    Input::Acked(group, bucket)
                }
                Output::Report(_) | Output::GroupFinished(..) | Output::Finished(_) => continue,
            };
            self.m.handle(self.now, input);
        }
        panic!("the machine never settled");
    }
}

#[test]
fn a_big_shed_is_released_in_batches_within_the_tick() {
    let mut w = World::new();
    // Alone: the node claims the whole group, a batch of claims per tick.
    for _ in 0..100 {
        w.settle();
        if w.m
            .owned(&group())
            .is_some_and(|o| o.len() == BUCKETS as usize)
        {
            break;
        }
        w.now += Duration::from_millis(20);
    }
    assert_eq!(w.held.len(), BUCKETS as usize, "the node owns the group");
    // A second member: the node sheds half, 6,000 buckets, at its next tick.
    w.peer = true;
    w.m.handle(w.now, Input::Wake);
    let ticks = w.ticks;
    w.now += Duration::from_millis(20);
    w.settle();
    let shed = (BUCKETS / 2) as usize;
    assert_eq!(
        w.held.len(),
        BUCKETS as usize - shed,
        "every shed bucket released"
    );
    assert!(
        w.releases.len() >= shed.div_ceil(RELEASE_BATCH)
            && w.releases.iter().all(|&n| n <= RELEASE_BATCH),
        "releases of {:?} buckets, at most {RELEASE_BATCH} each",
        w.releases
    );
    assert_eq!(
        w.ticks,
        ticks + 1,
        "the batches went out in the tick that shed, not one per tick"
    );
}
