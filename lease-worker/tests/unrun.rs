//! A session taken over from a predecessor (HO3) may be a member of groups this node does not
//! run: the machine leaves each of them (`Report::LeftUnrun`), also on a stop, with its answer
//! never taken for a group added meanwhile nor its timeout for the node's failure.

mod admission;
use admission::admit;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease_core::{
    Bucket, GroupBeat, GroupName, GroupView, Heartbeat, Incarnation, MemberLoad, NodeId, SessionId,
    ShardCount, Ttl, ViewStamp,
};
use lease_worker::machine::{Input, Machine, Output, Rules, StoreCall};
use uuid::Uuid;

const CALL_TIMEOUT: Duration = Duration::from_millis(1_500);

fn me() -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(1))
}

fn name(g: &str) -> GroupName {
    GroupName::new(g).expect("a group name")
}

fn four() -> ShardCount {
    ShardCount::new(4).expect("a count")
}

fn rules() -> Rules {
    Rules {
        node: me(),
        incarnation: Incarnation::new(),
        metadata: lease_core::MemberMetadata::default(),
        ttl: Ttl::new(Duration::from_secs(3)).expect("ttl"),
        renew_interval: Duration::from_secs(1),
        safety_margin: Duration::from_millis(500),
        wake_debounce: Duration::from_millis(10),
        call_timeout: CALL_TIMEOUT,
        ack_limit: Some(Duration::from_secs(2)),
        keep_on_stop: None,
        loads: Default::default(),
    }
}

/// A heartbeat of the taken-over session `s` listing `groups`, none of whose buckets the node
/// owns.
fn taken_over(s: SessionId, groups: &[&str]) -> Heartbeat {
    let at: DateTime<Utc> = DateTime::UNIX_EPOCH + chrono::TimeDelta::days(20_000);
    Heartbeat {
        session: s,
        new_session: false,
        observed_at: at,
        expires_at: at + chrono::TimeDelta::seconds(3),
        groups: groups
            .iter()
            .map(|g| GroupBeat {
                group: name(g),
                view: GroupView::new(four(), vec![MemberLoad::new(me(), 0)], 0),
                owned: Vec::new(),
                stamp: ViewStamp::default(),
                quarantined: Vec::new(),
            })
            .collect(),
        unchanged: Vec::new(),
        position: None,
    }
}

/// Poll until the next store call (returned) or nothing; the reports seen on the way.
fn next(m: &mut Machine, now: Instant, reports: &mut Vec<String>) -> Option<StoreCall> {
    while let Some(out) = m.poll(now) {
        match out {
            Output::Call(c) => return Some(c),
            Output::Report(r) => reports.push(format!("{r:?}")),
            Output::Finished(r) => reports.push(format!("Finished({r:?})")),
            Output::GroupFinished(g, r) => reports.push(format!("GroupFinished({g}, {r:?})")),
            Output::Deliver(g, d) => panic!("nothing is owned, yet {g} got {d:?}"),
        }
    }
    None
}

/// A node running `orders` whose first heartbeat answers with a session that is also a member
/// of `audit`: its next call leaves `audit`.
fn started(now: Instant) -> (Machine, SessionId) {
    let mut m = Machine::new(rules(), now);
    admit(&mut m, now, name("orders"), four());
    m.handle_timeout(now);
    let mut reports = Vec::new();
    let call = next(&mut m, now, &mut reports);
    assert!(
        matches!(call, Some(StoreCall::Heartbeat { .. })),
        "{call:?}"
    );
    let s = SessionId::from_uuid(Uuid::from_u128(7));
    m.handle(
        now,
        Input::Heartbeat(Ok(taken_over(s, &["audit", "orders"]))),
    );
    let call = next(&mut m, now, &mut reports);
    assert_eq!(
        call,
        Some(StoreCall::Leave {
            group: name("audit"),
            node: me(),
            session: s
        }),
        "{reports:?}"
    );
    (m, s)
}

#[test]
fn an_unrun_group_is_left_and_its_answer_is_not_a_group_added_meanwhile() {
    let t0 = Instant::now();
    let (mut m, s) = started(t0);
    // The application adds the group while the leave is in flight.
    assert!(m.add_group(name("audit"), four()));
    m.handle(
        t0,
        Input::Left(name("audit"), Ok(vec![Bucket(0), Bucket(2)])),
    );
    let mut reports = Vec::new();
    let call = next(&mut m, t0, &mut reports);
    assert!(
        reports
            .iter()
            .any(|r| r.starts_with("LeftUnrun") && r.contains("Ok(2)")),
        "{reports:?}"
    );
    assert!(
        !reports.iter().any(|r| r.starts_with("GroupFinished")),
        "the added group took the unrun leave's answer: {reports:?}"
    );
    // The added group is ensured, subscribed to and joined as any new group is.
    assert_eq!(
        call,
        Some(StoreCall::EnsureGroup {
            group: name("audit"),
            shards: four()
        })
    );
    m.handle(t0, Input::Ensured(name("audit"), Ok(())));
    assert_eq!(
        next(&mut m, t0, &mut reports),
        Some(StoreCall::Subscribe {
            group: name("audit")
        })
    );
    m.handle(t0, Input::Subscribed(name("audit"), Ok(())));
    let call = next(&mut m, t0, &mut reports);
    assert_eq!(
        call,
        Some(StoreCall::Join {
            group: name("audit"),
            node: me(),
            session: s
        })
    );
}

#[test]
fn an_unrun_leave_that_times_out_is_retried_not_the_node_s_failure() {
    let t0 = Instant::now();
    let (mut m, s) = started(t0);
    let late = t0 + CALL_TIMEOUT + Duration::from_millis(1);
    m.handle_timeout(late);
    let mut reports = Vec::new();
    let call = next(&mut m, late, &mut reports);
    assert!(
        reports
            .iter()
            .any(|r| r.starts_with("LeftUnrun") && r.contains("Timeout")),
        "{reports:?}"
    );
    assert!(
        !reports.iter().any(|r| r.starts_with("Error")),
        "the timeout was taken for a failure: {reports:?}"
    );
    // The next heartbeat lists it again: left again.
    let call = match call {
        Some(c) => c,
        None => {
            let at = m.poll_timeout().expect("a next tick");
            m.handle_timeout(at);
            next(&mut m, at, &mut reports).expect("a call")
        }
    };
    assert!(matches!(call, StoreCall::Heartbeat { .. }), "{call:?}");
    m.handle(
        late,
        Input::Heartbeat(Ok(taken_over(s, &["audit", "orders"]))),
    );
    assert_eq!(
        next(&mut m, late, &mut reports),
        Some(StoreCall::Leave {
            group: name("audit"),
            node: me(),
            session: s
        })
    );
}

#[test]
fn a_stop_leaves_the_unrun_groups_too() {
    let t0 = Instant::now();
    let mut m = Machine::new(rules(), t0);
    admit(&mut m, t0, name("orders"), four());
    m.handle_timeout(t0);
    let mut reports = Vec::new();
    let call = next(&mut m, t0, &mut reports);
    assert!(
        matches!(call, Some(StoreCall::Heartbeat { .. })),
        "{call:?}"
    );
    let s = SessionId::from_uuid(Uuid::from_u128(7));
    m.handle(
        t0,
        Input::Heartbeat(Ok(taken_over(s, &["audit", "orders"]))),
    );
    m.handle(t0, Input::Stop);
    let mut left = Vec::new();
    while let Some(call) = next(&mut m, t0, &mut reports) {
        match call {
            StoreCall::Leave { group, .. } => {
                left.push(group.to_string());
                m.handle(t0, Input::Left(group, Ok(Vec::new())));
            }
            other => panic!("a stop made {other:?}"),
        }
    }
    left.sort();
    assert_eq!(left, ["audit", "orders"], "{reports:?}");
    assert!(
        reports.iter().any(|r| r.starts_with("Finished(Ok")),
        "{reports:?}"
    );
}
