//! The compare rules, each as a deterministic race: one operation reads, another writes, then
//! the first writes what it decided. Each test fails when its compare is removed:
//!
//! | compare | test |
//! |---|---|
//! | a written group document's `mod_revision` | `a_claim_decided_before_another_claim_is_not_written` |
//! | clock mode: every node record read | `a_takeover_decided_before_the_owner_renewed_is_not_written` |
//! | clock mode: every group document read | `a_renewal_decided_before_a_takeover_is_not_written_after_it` |
//! | a created node record's absence (`version` 0) | `two_first_heartbeats_of_one_node_id_never_both_start_a_session` |
//! | lease mode: a written node record's `mod_revision` | `a_leave_decided_before_a_join_of_the_node_is_not_written` |
//! | a deleted node record's `mod_revision` | `a_dead_node_removed_on_a_read_before_it_restarted_is_not_removed` |
//! | lease mode: the liveness key's `mod_revision` | `a_take_over_decided_before_the_keep_lease_ended_is_not_written` |

use std::time::Duration;

use lease_core::{AdminStore, ManualClock, MemberMetadata, Takeover, Ttl, WorkerStore};

use super::*;

fn g() -> GroupName {
    GroupName::new("races").expect("a group name")
}

fn url() -> EtcdUrl {
    EtcdUrl {
        endpoints: lease_testetcd::cluster().endpoints(),
        prefix: lease_testetcd::prefix().trim_end_matches('/').to_owned(),
    }
}

async fn on(url: &EtcdUrl, clock: &ManualClock) -> EtcdLeaseStore {
    EtcdLeaseStore::connect_with_clock(url, clock.clone())
        .await
        .expect("a store")
}

/// A store in production mode: sessions on etcd leases.
async fn on_leases(url: &EtcdUrl) -> EtcdLeaseStore {
    EtcdLeaseStore::connect(url).await.expect("a store")
}

fn named(name: &str) -> GroupName {
    GroupName::new(name).expect("a group name")
}

fn ttl() -> Ttl {
    Ttl::from_secs(10).expect("a ttl")
}

/// `node`, started by `process`, in the group: its session.
async fn member(store: &EtcdLeaseStore, node: NodeId, process: Incarnation) -> SessionId {
    let none = MemberMetadata::empty();
    let session = store
        .heartbeat(node, process, ttl(), &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), node, session).await.expect("a join");
    session
}

/// An owner holding both buckets of a group of 2 (session of 10 s, from the clock's
/// start) and a taker that renewed 6 s in, so it is live when the owner is not.
struct Duel {
    url: EtcdUrl,
    clock: ManualClock,
    store: EtcdLeaseStore,
    owner: NodeId,
    owner_process: Incarnation,
    taker: NodeId,
    taker_session: SessionId,
}

async fn duel() -> Duel {
    let url = url();
    let clock = ManualClock::new();
    let store = on(&url, &clock).await;
    store
        .ensure_group(&g(), ShardCount::new(2).expect("a count"))
        .await
        .expect("a group");
    let (owner, taker) = (NodeId::new(), NodeId::new());
    let (owner_process, taker_process) = (Incarnation::new(), Incarnation::new());
    let none = MemberMetadata::empty();
    let so = member(&store, owner, owner_process).await;
    store
        .claim(&g(), owner, so, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    let taker_session = member(&store, taker, taker_process).await;
    clock.advance(Duration::from_secs(6));
    store
        .heartbeat(taker, taker_process, ttl(), &none, &[])
        .await
        .expect("the taker renews");
    Duel {
        url,
        clock,
        store,
        owner,
        owner_process,
        taker,
        taker_session,
    }
}

/// C5 through the group document's compare: a claim decided on a read that another claim
/// overtook is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_decided_before_another_claim_is_not_written() {
    let clock = ManualClock::new();
    let store = on(&url(), &clock).await;
    store
        .ensure_group(&g(), ShardCount::new(4).expect("a count"))
        .await
        .expect("a group");
    let (a, b) = (NodeId::new(), NodeId::new());
    let sa = member(&store, a, Incarnation::new()).await;
    let sb = member(&store, b, Incarnation::new()).await;

    let now = store.now();
    let read = store
        .load(Operation::Claim, &Scope::Group(&g()), now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    let won = decided
        .claim(now, &g(), a, sa, 4, Takeover::Allowed)
        .expect("a decision");
    assert_eq!(won.len(), 4);

    let overtaking = store
        .claim(&g(), b, sb, 4, Takeover::Allowed)
        .await
        .expect("the other claim");
    assert_eq!(overtaking.len(), 4);

    let written = store
        .store(Operation::Claim, &read, &decided, &read.extras, &Vec::new())
        .await
        .expect("a write");
    assert!(!written, "a claim on a stale read must not be written");
    let snap = store.snapshot(&g()).await.expect("a snapshot");
    assert!(snap.buckets.iter().all(|x| x.owner == Some(b)));
}

/// Clock mode, G3 through the node records' compare: a takeover decided while the owner
/// looked dead is not written if the owner renewed meanwhile (a renewal read a moment
/// earlier, on another host's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_decided_before_the_owner_renewed_is_not_written() {
    let Duel {
        url,
        clock,
        store,
        owner,
        owner_process,
        taker,
        taker_session: st,
    } = duel().await;
    let none = MemberMetadata::empty();

    // The owner's host reads a clock just before its expiry; the taker's just after.
    let owner_clock = ManualClock::starting_at(clock.now() + chrono::TimeDelta::seconds(3));
    clock.advance(Duration::from_secs(4));
    let now = store.now();
    let read = store
        .load(Operation::Claim, &Scope::Group(&g()), now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    let taken = decided
        .claim(now, &g(), taker, st, 2, Takeover::Allowed)
        .expect("a decision");
    assert_eq!(taken.len(), 2, "the owner looks dead to the taker");

    let owner_store = on(&url, &owner_clock).await;
    let renewed = owner_store
        .heartbeat(owner, owner_process, ttl(), &none, &[])
        .await
        .expect("the owner renews");
    assert!(!renewed.new_session, "the owner renews its session in time");

    let written = store
        .store(Operation::Claim, &read, &decided, &read.extras, &Vec::new())
        .await
        .expect("a write");
    assert!(
        !written,
        "a takeover of a session renewed meanwhile must not be written"
    );
}

/// Clock mode, the same race the other way round, through the compare of the group
/// documents a write read but does not write: a renewal decided while the owner was live
/// is not written after a claim took its buckets at a later time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_decided_before_a_takeover_is_not_written_after_it() {
    let Duel {
        url: _,
        clock,
        store,
        owner,
        owner_process,
        taker,
        taker_session: st,
    } = duel().await;
    let none = MemberMetadata::empty();

    // The owner's host reads just before its expiry and decides to renew...
    let owner_now = clock.now() + chrono::TimeDelta::seconds(3);
    let scope = Scope::Node(owner, &[]);
    let read = store
        .load(Operation::Heartbeat, &scope, owner_now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    let beat = decided
        .heartbeat(owner_now, owner, owner_process, ttl(), &none, &[], None)
        .expect("a decision");
    assert!(!beat.new_session, "the owner renews its live session");

    // ...then the taker, at a time past it, takes its buckets...
    clock.advance(Duration::from_secs(4));
    let taken = store
        .claim(&g(), taker, st, 2, Takeover::Allowed)
        .await
        .expect("the takeover");
    assert_eq!(taken.len(), 2);

    // ...and the renewal must not land on top of that.
    let written = store
        .store(
            Operation::Heartbeat,
            &read,
            &decided,
            &read.extras,
            &Vec::new(),
        )
        .await
        .expect("a write");
    assert!(
        !written,
        "a renewal read before a takeover must not be written after it"
    );
}

/// H7 through the node record's creation compare: two processes starting one node id at
/// once never both start a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_heartbeats_of_one_node_id_never_both_start_a_session() {
    let clock = ManualClock::new();
    let store = on(&url(), &clock).await;
    let node = NodeId::new();
    let none = MemberMetadata::empty();
    let now = store.now();
    let scope = Scope::Node(node, &[]);
    let read = store
        .load(Operation::Heartbeat, &scope, now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    decided
        .heartbeat(now, node, Incarnation::new(), ttl(), &none, &[], None)
        .expect("a decision");

    let other = store
        .heartbeat(node, Incarnation::new(), ttl(), &none, &[])
        .await
        .expect("the other process's heartbeat");
    assert!(other.new_session);

    let written = store
        .store(
            Operation::Heartbeat,
            &read,
            &decided,
            &read.extras,
            &Vec::new(),
        )
        .await
        .expect("a write");
    assert!(
        !written,
        "a second session for one node id must not be written"
    );
}

/// Lease mode, through the compare of a node record the write changes: an operator's leave
/// of one of a node's groups, decided before the node joined another, is not written (it
/// would drop the new group from the node's record, the index its heartbeats and its next
/// session read, while the group lists it as a member). Lease mode compares a record only
/// when it writes it (renewals do not write it), so nothing else would notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_decided_before_a_join_of_the_node_is_not_written() {
    let store = on_leases(&url()).await;
    let (kept, left, joined) = (named("kept"), named("left"), named("joined"));
    for group in [&kept, &left, &joined] {
        store
            .ensure_group(group, ShardCount::new(2).expect("a count"))
            .await
            .expect("a group");
    }
    let node = NodeId::new();
    let none = MemberMetadata::empty();
    let session = store
        .heartbeat(node, Incarnation::new(), ttl(), &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&kept, node, session).await.expect("a join");
    store.join(&left, node, session).await.expect("a join");

    let now = store.now();
    let read = store
        .load(Operation::Leave, &Scope::Group(&left), now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    decided
        .leave(now, &left, node, None)
        .expect("the operator's leave");
    assert_eq!(decided.groups_of(node), vec![kept.clone()]);

    store.join(&joined, node, session).await.expect("a join");

    let written = store
        .store(Operation::Leave, &read, &decided, &read.extras, &Vec::new())
        .await
        .expect("a write");
    assert!(
        !written,
        "a leave read before the node joined another group must not be written"
    );
}

/// Through the compare of a node record the write deletes: a heartbeat that found another
/// node dead and in no group (H9) does not delete its record once that node has started a
/// new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_removed_on_a_read_before_it_restarted_is_not_removed() {
    let clock = ManualClock::new();
    let store = on(&url(), &clock).await;
    let (dead, newcomer) = (NodeId::new(), NodeId::new());
    let none = MemberMetadata::empty();
    store
        .heartbeat(dead, Incarnation::new(), ttl(), &none, &[])
        .await
        .expect("a heartbeat");
    clock.advance(Duration::from_secs(11));

    let now = store.now();
    let read = store
        .load(Operation::Heartbeat, &Scope::Node(newcomer, &[]), now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    let beat = decided
        .heartbeat(now, newcomer, Incarnation::new(), ttl(), &none, &[], None)
        .expect("a decision");
    assert!(beat.new_session);
    assert!(
        !decided.nodes.contains_key(&dead),
        "the newcomer's first heartbeat removes the dead node"
    );

    let restarted = store
        .heartbeat(dead, Incarnation::new(), ttl(), &none, &[])
        .await
        .expect("the dead node's process starts again");
    assert!(restarted.new_session);

    let written = store
        .store(
            Operation::Heartbeat,
            &read,
            &decided,
            &read.extras,
            &Vec::new(),
        )
        .await
        .expect("a write");
    assert!(!written, "a live session's record must not be removed");
}

/// Lease mode, through the compare of the liveness key: a successor's take-over of a
/// handed-over session (HO3), decided while the keep lease was live, is not written once
/// etcd ended that lease and another node took the session's buckets. The take-over changes
/// the node's record, which nothing else wrote, and no group; written, it would bring the
/// ended session back, on a lease of its own, believing it holds buckets another node holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_decided_before_the_keep_lease_ended_is_not_written() {
    let store = on_leases(&url()).await;
    store
        .ensure_group(&g(), ShardCount::new(2).expect("a count"))
        .await
        .expect("a group");
    let (node, other) = (NodeId::new(), NodeId::new());
    let first = Incarnation::new();
    let session = member(&store, node, first).await;
    let held = store
        .claim(&g(), node, session, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    assert_eq!(held.len(), 2);
    let other_session = member(&store, other, Incarnation::new()).await;
    let keep = Ttl::from_secs(5).expect("a keep");
    store
        .hand_over(node, first, keep)
        .await
        .expect("a hand-over")
        .expect("handed over");

    // The successor reads while the keep lease is live and decides to take the session over.
    let op = Operation::Heartbeat;
    let successor = Incarnation::new();
    let now = store.now();
    let read = store
        .load(op, &Scope::Node(node, &[]), now, true)
        .await
        .expect("a read");
    let mut decided = read.state.clone();
    let beat = decided
        .heartbeat(
            now,
            node,
            successor,
            ttl(),
            &MemberMetadata::empty(),
            &[],
            None,
        )
        .expect("a decision");
    assert!(!beat.new_session, "the session is taken over");
    assert_eq!(
        beat.group(&g()).map(|v| v.owned.len()),
        Some(2),
        "with its buckets"
    );
    let keep_lease = read
        .extras
        .get(&node)
        .and_then(|e| e.lease)
        .expect("the keep lease");
    let grant = store.grant(op, ttl()).await.expect("a lease");
    let mut extras = read.extras.clone();
    extras.insert(
        node,
        NodeExtra {
            lease: Some(grant.id()),
            ttl: Some(ttl().as_micros()),
        },
    );
    let key_rev = read
        .lives
        .get(&node)
        .map(|l| l.1)
        .expect("the liveness key");
    let lives: LivePuts = vec![(node, beat.session, grant.id(), key_rev)];

    // The keep lease ends (revoked, as etcd's lessor does when it runs out), and another
    // node takes the buckets of the ended session.
    store.revoke(keep_lease).await;
    let taken = store
        .claim(&g(), other, other_session, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    assert_eq!(taken.len(), 2, "the session is over: its buckets are taken");

    let written = store
        .store(op, &read, &decided, &extras, &lives)
        .await
        .expect("a write");
    store.revoke(grant.id()).await;
    assert!(
        !written,
        "a take-over of a session whose lease ended meanwhile must not be written"
    );
}
