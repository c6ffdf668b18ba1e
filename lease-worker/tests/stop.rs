//! A stop (and the removal of a node's last group) with explicit time, against a small store
//! that answers at once: the session is renewed while the applications acknowledge their
//! revocations, nothing is delivered past the trust deadline as if the bucket were still held,
//! and a stop that cannot hand its session over (a stuck bucket) leaves every group.

mod admission;
mod stop_world;
use stop_world::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lease_core::RevokeReason;
use lease_worker::machine::{Delivery, Input, Report, StoreCall};

/// The longest time between the stop and its first heartbeat, between two heartbeats, or
/// between the last heartbeat and the last leave.
fn longest_gap(stop: Instant, beats: &[Instant], last_leave: Instant) -> Duration {
    let mut marks = vec![stop];
    marks.extend(beats.iter().copied());
    marks.push(last_leave);
    marks
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

/// A stop whose application takes 100 ms per revocation (64 of them: 6.4 s, more than two
/// ttls) renews the session on its cadence until the last revocation is acknowledged and the
/// group left: every revocation is delivered while the leases are trusted, as a shutdown.
/// Without renewals during the stop, the session outlived its trust 2.5 s into it, and the
/// rest went on being delivered as shutdowns while a peer could already hold the buckets.
#[test]
fn a_slow_stop_keeps_renewing_until_the_last_revocation_is_acknowledged() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| SLOW);
    let revoked = w.revocations(stop);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    assert!(
        revoked.iter().all(|d| d.trusted),
        "revocations delivered past the trust deadline: {}",
        untrusted(&revoked)
    );
    assert!(
        revoked.iter().all(|d| reason(d) == RevokeReason::Shutdown),
        "a revocation of the stop said another reason"
    );
    let last_ack = revoked.last().expect("revocations").at + SLOW;
    let (leave_at, _) = w
        .calls
        .iter()
        .find(|(_, c)| matches!(c, StoreCall::Leave { .. }))
        .expect("the group left");
    assert!(
        *leave_at >= last_ack,
        "left before the last acknowledgement"
    );
    let beats = w.heartbeats_since(stop);
    let gap = longest_gap(stop, &beats, *leave_at);
    assert!(
        gap <= RENEW + SLOW,
        "{} heartbeats in the {:?} stop, the longest gap {gap:?}",
        beats.len(),
        *leave_at - stop
    );
    assert_eq!(w.finished.as_deref(), Some("Ok(())"));
}

/// The same slow stop with the store out of reach for heartbeats: renewals are retried, and at
/// the trust deadline the node fences as it does everywhere else. What is still to be revoked
/// then is delivered as `fenced`, never as a shutdown the application would take for a bucket
/// it still holds.
#[test]
fn a_stop_that_cannot_renew_says_fenced_past_the_trust_deadline() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.heartbeats_fail = true;
    w.advance(RENEW / 2);
    let stop = w.now;
    let deadline = w.trusted_until.expect("trusted");
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| SLOW);
    let revoked = w.revocations(stop);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    let as_held = untrusted_as_held(&revoked);
    assert!(
        as_held.is_empty(),
        "{} delivered past the trust deadline as if still held, the first {:?}",
        as_held.len(),
        as_held.first()
    );
    let before = revoked.iter().filter(|d| d.at < deadline).count();
    assert!(
        before > 0 && before < revoked.len(),
        "the deadline fell within the stop"
    );
    assert!(
        revoked
            .iter()
            .all(|d| (d.at < deadline) == (reason(d) == RevokeReason::Shutdown)),
        "shutdown before the deadline, expired after"
    );
    assert!(
        w.reports.iter().any(|r| matches!(r, Report::Fenced { .. })),
        "the node fenced"
    );
    let retries = w.heartbeats_since(stop).len();
    assert!(retries >= 5, "{retries} renewals tried during a 6.4 s stop");
}

/// Removing the node's last group (a node that stays up with no group) is a stop of that group:
/// the session is renewed until its application acknowledged every revocation and the group
/// is left. Without it, nothing renewed a node whose groups were all being removed.
#[test]
fn removing_the_last_group_keeps_renewing_until_it_is_left() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let removed = w.now;
    assert!(w.m.remove_group(&name("orders")));
    w.drain();
    let limit = w.now + Duration::from_secs(30);
    while w.m.groups().next().is_some() {
        assert!(w.now < limit, "the group was not removed");
        w.answer();
        w.advance(SLOW);
        w.ack(&name("orders"));
    }
    let revoked = w.revocations(removed);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    assert!(
        revoked.iter().all(|d| d.trusted),
        "revocations delivered past the trust deadline: {}",
        untrusted(&revoked)
    );
    let (leave_at, _) = w
        .calls
        .iter()
        .find(|(_, c)| matches!(c, StoreCall::Leave { .. }))
        .expect("the group left");
    let beats = w.heartbeats_since(removed);
    let gap = longest_gap(removed, &beats, *leave_at);
    assert!(
        gap <= RENEW + SLOW,
        "the longest gap between renewals {gap:?}"
    );
    assert!(!w.m.is_stopping(), "removing a group stopped the node");
}

/// A node that would hand its session over at a stop (`keep_on_stop`) but whose application
/// does not acknowledge a revocation in time (a stuck bucket) hands nothing over: it leaves
/// every group, so their buckets are released at the stop rather than at the session's
/// expiry. The other group, whose application acknowledges at once, leaves too, though its
/// revocations were done long before the bucket got stuck.
#[test]
fn a_stop_with_a_stuck_bucket_leaves_every_group_instead_of_handing_over() {
    let mut w = World::new(
        rules(
            Some(Duration::from_millis(200)),
            Some(Duration::from_secs(10)),
        ),
        &["orders", "audit"],
    );
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    // The application of `orders` never acknowledges its first revocation: given up on after
    // 200 ms, the bucket is stuck. `audit`'s acknowledges each at once.
    let stuck = w
        .pending
        .get(&name("orders"))
        .copied()
        .expect("a revocation in orders");
    w.pending.remove(&name("orders"));
    let limit = w.now + Duration::from_secs(30);
    while w.finished.is_none() {
        assert!(w.now < limit, "the node did not finish");
        w.answer();
        // `audit` acknowledges everything at once: its revocations are all done long before
        // the bucket of `orders` gets stuck.
        while w.pending.contains_key(&name("audit")) {
            w.ack(&name("audit"));
        }
        if w.m.stuck(&name("orders")).is_empty() {
            w.advance(Duration::from_millis(10));
        } else {
            w.ack(&name("orders"));
            if w.call.is_none() && w.pending.is_empty() {
                w.advance(Duration::from_millis(10));
            }
        }
    }
    let Delivery::Revoke { bucket, .. } = stuck else {
        panic!("{stuck:?}");
    };
    assert!(
        w.reports
            .iter()
            .any(|r| matches!(r, Report::Stuck { bucket: b, .. } if *b == bucket)),
        "the bucket got stuck"
    );
    assert!(
        !w.calls
            .iter()
            .any(|(_, c)| matches!(c, StoreCall::HandOver { .. })),
        "the session was handed over with a stuck bucket"
    );
    assert_eq!(
        w.left(),
        [name("audit"), name("orders")].into_iter().collect(),
        "the groups left at the stop: {:?}",
        w.calls
            .iter()
            .filter(|(at, _)| *at >= stop)
            .map(|(_, c)| c)
            .collect::<Vec<_>>()
    );
    assert!(
        w.held.values().all(BTreeSet::is_empty),
        "buckets still held in the store: {:?}",
        w.held
    );
}

/// The same stop without a stuck bucket hands the session over and leaves no group: the
/// buckets stay with the session for a successor.
#[test]
fn a_stop_without_a_stuck_bucket_hands_over_and_leaves_nothing() {
    let mut w = World::new(
        rules(
            Some(Duration::from_millis(200)),
            Some(Duration::from_secs(10)),
        ),
        &["orders", "audit"],
    );
    w.own_everything();
    w.advance(RENEW / 2);
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| Duration::from_millis(1));
    assert!(w.left().is_empty(), "a group left: {:?}", w.left());
    assert!(
        w.calls
            .iter()
            .any(|(_, c)| matches!(c, StoreCall::HandOver { .. })),
        "no hand-over"
    );
    assert!(
        w.held.values().all(|h| h.len() == BUCKETS as usize),
        "the buckets stay with the session"
    );
}

/// A revocation that goes out at the trust deadline before the node has handled the deadline
/// itself (the first thing the driver handles past it is an acknowledgement, or a call's
/// answer) says `fenced` all the same: whatever it was queued for, the lease is not trusted
/// any more.
#[test]
fn a_revocation_delivered_at_the_deadline_before_the_fence_says_fenced() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.heartbeats_fail = true;
    let deadline = w.trusted_until.expect("trusted");
    w.m.handle(w.now, Input::Stop);
    w.drain();
    // The application acknowledges every revocation at once, and the first one only at the
    // deadline: the stop's renewals fail meanwhile.
    w.answer();
    let gap = deadline - w.now;
    w.jump(gap);
    w.ack(&name("orders"));
    let after: Vec<&Delivered> = w
        .revocations(deadline)
        .into_iter()
        .filter(|d| d.at >= deadline)
        .collect();
    assert!(!after.is_empty(), "a revocation went out at the deadline");
    assert_eq!(
        reason(after[0]),
        RevokeReason::Fenced,
        "the first revocation at the deadline, before the fence: {:?}",
        after[0].delivery
    );
}

/// A heartbeat during a stop that finds the node's session gone (it expired unseen; a new
/// one starts): the buckets are not the node's any more, so every revocation still queued
/// says `expired`, not `shutdown`, though the new session is trusted.
#[test]
fn a_new_session_during_a_stop_turns_the_rest_into_expired() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.end_session();
    w.run(Duration::from_secs(30), |_| SLOW);
    let beats = w.heartbeats_since(stop);
    let new_at = *beats.first().expect("a renewal during the stop");
    let revoked = w.revocations(stop);
    assert!(
        revoked.iter().any(|d| d.at <= new_at),
        "revoked before the new session"
    );
    let wrong: Vec<String> = revoked
        .iter()
        .filter(|d| d.at > new_at && reason(d) != RevokeReason::Expired)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} revocations after the new session did not say expired, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// An operator evicts the node from a group it is stopping (or removing): the group's buckets
/// are free for others at once, so every revocation still queued says `lost`, not `shutdown`.
#[test]
fn an_eviction_during_a_stop_turns_the_rest_into_lost() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.evict(&name("orders"));
    w.run(Duration::from_secs(30), |_| SLOW);
    let beats = w.heartbeats_since(stop);
    let seen_at = *beats.first().expect("a renewal during the stop");
    let revoked = w.revocations(stop);
    let wrong: Vec<String> = revoked
        .iter()
        .filter(|d| d.at > seen_at && reason(d) != RevokeReason::Lost)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        revoked.iter().filter(|d| d.at > seen_at).count() > BUCKETS as usize / 2,
        "most revocations came after the eviction was seen"
    );
    assert!(
        wrong.is_empty(),
        "{} revocations after the eviction did not say lost, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// The same for a group the node is shedding: an eviction seen while shed revocations are
/// still queued turns them into `lost`, since the buckets are free for others already.
#[test]
fn an_eviction_while_shedding_turns_the_rest_into_lost() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    // A peer joins: the node sheds half, one revocation at a time, 100 ms each.
    w.peers = 1;
    w.advance(RENEW);
    let shed_from = w.now;
    let limit = w.now + Duration::from_secs(30);
    let mut evicted_at = None;
    while w.now < limit {
        w.answer();
        let shed = w
            .revocations(shed_from)
            .iter()
            .filter(|d| reason(d) == RevokeReason::Shed)
            .count();
        if evicted_at.is_none() && shed >= 4 {
            w.evict(&name("orders"));
            evicted_at = Some(w.now);
        }
        if evicted_at.is_some_and(|t| {
            w.heartbeats_since(t)
                .first()
                .is_some_and(|&b| w.now >= b + Duration::from_secs(4))
        }) {
            break;
        }
        w.advance(SLOW);
        w.ack(&name("orders"));
    }
    let evicted_at = evicted_at.expect("shedding began");
    let seen_at = *w
        .heartbeats_since(evicted_at)
        .first()
        .expect("a heartbeat after");
    let after: Vec<&Delivered> = w
        .revocations(shed_from)
        .into_iter()
        .filter(|d| d.at > seen_at)
        .collect();
    assert!(
        after.len() >= BUCKETS as usize / 2,
        "{} revocations after the eviction was seen",
        after.len()
    );
    let wrong: Vec<String> = after
        .iter()
        .filter(|d| reason(d) != RevokeReason::Lost)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} revocations after the eviction did not say lost, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// A process frozen past its trust deadline (SIGSTOP) runs again: its fence queues every
/// revocation as `fenced`, and its first renewal finds the session gone while they are still
/// going out, one at a time. They keep saying `fenced`: the node stopped trusting its leases by
/// its own clock, before the store answered. Turned into `expired` on that answer, the
/// revocations would read as if the node had worked on until the store told it.
#[test]
fn fenced_revocations_stay_fenced_when_the_renewal_then_finds_the_session_gone() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    let deadline = w.trusted_until.expect("trusted");
    // Frozen: nothing is handled until well past the deadline, and the session expires.
    w.jump(deadline - w.now + TTL);
    let thawed = w.now;
    w.end_session();
    w.drain();
    assert!(
        w.reports.iter().any(|r| matches!(r, Report::Fenced { .. })),
        "the node fenced when it ran again"
    );
    assert!(
        matches!(w.call, Some((StoreCall::Heartbeat { .. }, _))),
        "a renewal went out with the fence: {:?}",
        w.call
    );
    // The renewal answers (a new session) after the first revocation went out, before the
    // application acknowledged it.
    w.answer();
    for _ in 0..BUCKETS * 2 {
        w.ack(&name("orders"));
        w.answer();
    }
    let revoked = w.revocations(thawed);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    let wrong: Vec<String> = revoked
        .iter()
        .filter(|d| reason(d) != RevokeReason::Fenced)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} revocations did not say fenced, the first {:?}",
        wrong.len(),
        revoked.len(),
        wrong.first()
    );
}
