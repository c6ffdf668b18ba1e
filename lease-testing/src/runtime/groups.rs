//! Runtime cases of several groups: groups sharing one store, a node in several groups
//! sharing each by its own count, groups added and removed at run time, and a node cut off
//! fencing in every group at once.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use lease_core::{Clock, LeaseStore, OwnershipEvent, RevokeReason, Timestamp};

use super::{Env, Nodes, POLL, Pool, RENEW, TTL, WAKE_UP_BOUND, until};

/// Two groups on one store, of different sizes, balance independently.
pub async fn several_groups_share_one_store_without_interfering<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut orders = Pool::new(&env, "orders", 16, true);
    // Bucket numbers repeat across groups: each group is checked on a log of its own.
    let mut invoices = Pool::new(&env, "invoices", 5, true);
    for _ in 0..2 {
        orders.start().await;
        invoices.start().await;
    }
    invoices.start().await;
    orders.until_balanced(5 * RENEW, "orders").await;
    invoices.until_balanced(5 * RENEW, "invoices").await;
    assert!(orders.owned().values().all(|&n| n == 8));
    let mut split: Vec<usize> = invoices.owned().values().copied().collect();
    split.sort_unstable();
    assert_eq!(split, vec![1, 2, 2]);
    orders.shutdown().await;
    invoices.shutdown().await;
}

/// Three nodes, each in three groups of different shard counts (`orders` 16, `billing` 64,
/// `audit` 5), share each group evenly by its own count, in one heartbeat per node per tick
/// whatever its groups: exactly one per renew interval on the paused clock, within one of it on
/// real time. The first node is also alone in `solo` (4). An operator evicting it from `solo`
/// makes it revoke its `solo` buckets (lost), join again and own them again; its other
/// groups' applications hear nothing of it. (Evicted from a group with other members, its
/// buckets there are taken by them as soon as the eviction wakes them, racing the evicted
/// node's own wake-up: an operator's eviction frees the buckets at once, and only the
/// fencing tokens keep the evicted node's late writes out. So the case evicts from a group no
/// one else can take over.)
pub async fn a_node_in_three_groups_shares_each_by_its_own_count<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const GROUPS: [&str; 3] = ["orders", "billing", "audit"];
    let mut nodes = Nodes::new(
        &env,
        &[("orders", 16), ("billing", 64), ("audit", 5), ("solo", 4)],
    );
    let mut ids = vec![nodes.start(&["orders", "billing", "audit", "solo"]).await];
    for _ in 0..2 {
        ids.push(nodes.start(&GROUPS).await);
    }
    let took = nodes
        .until_balanced(
            &["orders", "billing", "audit", "solo"],
            5 * RENEW,
            "three groups over three nodes, and solo",
        )
        .await;
    eprintln!("3 nodes x 3 groups (16, 64, 5 buckets): balanced in {took:?}");
    for (g, loads) in [
        ("orders", [5, 5, 6]),
        ("billing", [21, 21, 22]),
        ("audit", [1, 2, 2]),
    ] {
        let mut owned: Vec<usize> = nodes.owned(g).into_values().collect();
        owned.sort_unstable();
        assert_eq!(owned, loads, "{g}");
    }
    // Steady state: one heartbeat per node per tick, for its three groups.
    let before: Vec<u64> = ids
        .iter()
        .map(|&id| nodes.faults(id).heartbeats.load(Ordering::SeqCst))
        .collect();
    tokio::time::sleep(5 * RENEW).await;
    for (i, &id) in ids.iter().enumerate() {
        let beats = nodes.faults(id).heartbeats.load(Ordering::SeqCst) - before[i];
        if env.paused {
            assert_eq!(
                beats, 5,
                "heartbeats of a node in 3 groups in 5 renew intervals"
            );
        } else {
            assert!(
                (4..=6).contains(&beats),
                "{beats} heartbeats of a node in 3 groups in 5 renew intervals"
            );
        }
    }
    // An operator evicts the first node from solo (its other groups keep its session).
    let evicted = ids[0];
    let seen: BTreeMap<&str, usize> = ["orders", "billing", "audit", "solo"]
        .iter()
        .map(|&g| (g, nodes.events_of(evicted, g).len()))
        .collect();
    nodes
        .store
        .evict(&Nodes::<S>::group("solo"), evicted)
        .await
        .expect("evict");
    let lost = |nodes: &Nodes<S>| {
        nodes.events_of(evicted, "solo")[seen["solo"]..]
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Lost,
                        ..
                    }
                )
            })
            .count()
    };
    until(
        RENEW + env.slack(),
        "the evicted node revoking its solo buckets (lost) and owning them again",
        || lost(&nodes) == 4 && nodes.owned("solo")[&evicted] == 4,
        || nodes.events_of(evicted, "solo"),
    )
    .await;
    let listed = nodes.store.nodes().await.expect("nodes");
    let row = listed
        .nodes
        .iter()
        .find(|n| n.node == evicted)
        .expect("the evicted node is listed");
    assert_eq!(row.groups.len(), 4, "{row:?}");
    for g in GROUPS {
        assert_eq!(
            nodes.events_of(evicted, g).len(),
            seen[g],
            "the node's {g} application heard of the eviction from solo"
        );
    }
    nodes.until_balanced(&GROUPS, RENEW, "still balanced").await;
    nodes.shutdown().await;
}

/// Groups come and go on running nodes without disturbing the others: two nodes share
/// `orders` (12); `billing` (8) added to both at run time is shared evenly while `orders`
/// moves nothing. Removing `orders` from the first node revokes its 6 (shutdown) and the
/// second owns all 12 at once (the leave wakes it), the first node's `billing` untouched and
/// its session kept. Removing its last group ends its session (the store lists it no more);
/// added again, `orders` is shared again under a new session.
pub async fn groups_added_and_removed_at_run_time_leave_the_others_alone<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut nodes = Nodes::new(&env, &[("orders", 12), ("billing", 8)]);
    let a = nodes.start(&["orders"]).await;
    let b = nodes.start(&["orders"]).await;
    nodes
        .until_balanced(&["orders"], 5 * RENEW, "orders over two nodes")
        .await;
    let orders_events =
        |nodes: &Nodes<S>| nodes.events_of(a, "orders").len() + nodes.events_of(b, "orders").len();
    let quiet = orders_events(&nodes);
    nodes.add(a, "billing").await;
    nodes.add(b, "billing").await;
    nodes
        .until_balanced(&["billing"], 2 * RENEW + env.slack(), "billing added")
        .await;
    assert_eq!(orders_events(&nodes), quiet, "orders moved as billing came");
    assert!(nodes.balanced("orders"));

    // Removing one group of two keeps the node's session and its other group.
    let billing_seen = nodes.events_of(a, "billing").len();
    let session = nodes.session_expiry(a).await;
    assert!(session.is_some(), "a's session is not live");
    let removed_at = nodes.clock.now();
    nodes.remove(a, "orders").await;
    let shutdown = nodes
        .events_of(a, "orders")
        .iter()
        .filter(|(t, e)| {
            *t >= removed_at
                && matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Shutdown,
                        ..
                    }
                )
        })
        .count();
    assert_eq!(shutdown, 6, "a's orders buckets revoked (shutdown)");
    let took = nodes
        .until_balanced(
            &["orders"],
            WAKE_UP_BOUND + env.slack(),
            "b taking all of orders",
        )
        .await;
    eprintln!("a group removed from a node: its 6 buckets re-owned in {took:?}");
    assert_eq!(nodes.owned("orders")[&b], 12);
    assert_eq!(
        nodes.events_of(a, "billing").len(),
        billing_seen,
        "removing orders touched a's billing"
    );
    let listed = nodes.store.nodes().await.expect("nodes");
    let a_row = listed
        .nodes
        .iter()
        .find(|n| n.node == a)
        .expect("a is listed");
    assert!(a_row.live, "removing one of two groups ended a's session");
    assert_eq!(a_row.groups, vec![Nodes::<S>::group("billing")]);

    // Removing the last group ends the session (contract rule L3).
    nodes.remove(a, "billing").await;
    nodes
        .until_balanced(
            &["billing"],
            WAKE_UP_BOUND + env.slack(),
            "b taking all of billing",
        )
        .await;
    let listed = nodes.store.nodes().await.expect("nodes");
    assert!(
        listed.nodes.iter().all(|n| n.node != a),
        "a node in no group is still listed: {:?}",
        listed.nodes
    );
    // Back in orders, under a new session.
    nodes.add(a, "orders").await;
    nodes
        .until_balanced(
            &["orders", "billing"],
            2 * RENEW + env.slack(),
            "a back in orders",
        )
        .await;
    assert_eq!(nodes.owned("orders")[&a], 6);
    nodes.shutdown().await;
}

/// A node cut off from the store (every call hangs, as over a cut network or from a process
/// that stopped being scheduled) in three groups revokes its buckets of every group (expired)
/// at its one trust deadline, before its session expires: the other node is assigned none of
/// them before that, and all of them after the session expired. Healed, the node gets its
/// share of every group back.
pub async fn a_paused_node_fences_in_every_group_before_any_bucket_is_taken<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const GROUPS: [&str; 3] = ["orders", "billing", "audit"];
    let mut nodes = Nodes::new(&env, &[("orders", 8), ("billing", 12), ("audit", 3)]);
    let a = nodes.start(&GROUPS).await;
    let b = nodes.start(&GROUPS).await;
    nodes.until_balanced(&GROUPS, 5 * RENEW, "cold start").await;
    let held: BTreeMap<&str, usize> = GROUPS.iter().map(|&g| (g, nodes.owned(g)[&a])).collect();
    let seen: BTreeMap<&str, usize> = GROUPS
        .iter()
        .map(|&g| (g, nodes.events_of(b, g).len()))
        .collect();
    let faults = nodes.faults(a);
    let cut_at = nodes.clock.now();
    faults.hang.store(true, Ordering::SeqCst);
    // Follow a's session's expiry: a heartbeat already sent when it was cut off may still
    // renew it.
    let start = Instant::now();
    let limit = TTL + RENEW + env.slack();
    let mut expiry = None;
    loop {
        if let Some(e) = nodes.session_expiry(a).await {
            expiry = expiry.max(Some(e));
        }
        if GROUPS
            .iter()
            .all(|g| nodes.owned(g)[&b] == nodes.groups[&Nodes::<S>::group(g)].0 as usize)
        {
            break;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed < limit,
            "b taking every group: not within {limit:?}; {:?}",
            GROUPS
                .iter()
                .map(|g| (*g, nodes.owned(g)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(POLL.min(limit - elapsed)).await;
    }
    let expiry = expiry.expect("a's session was seen in the store");
    let mut last_fence = None;
    for g in GROUPS {
        let fenced: Vec<Timestamp> = nodes
            .events_of(a, g)
            .into_iter()
            .filter(|(t, e)| {
                *t >= cut_at
                    && matches!(
                        e,
                        OwnershipEvent::Revoked {
                            reason: RevokeReason::Fenced,
                            ..
                        }
                    )
            })
            .map(|(t, _)| t)
            .collect();
        assert_eq!(fenced.len(), held[g], "a did not fence every bucket of {g}");
        last_fence = last_fence.max(fenced.iter().max().copied());
    }
    let last_fence = last_fence.expect("a fenced");
    assert!(
        last_fence < expiry,
        "a fenced its last bucket at {last_fence}, its session expired at {expiry}"
    );
    for g in GROUPS {
        let taken: Vec<Timestamp> = nodes.events_of(b, g)[seen[g]..]
            .iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned(_)))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(taken.len(), held[g], "b took a's buckets of {g}");
        for t in taken {
            assert!(
                t >= expiry && t > last_fence,
                "b was assigned a bucket of {g} at {t}: a fenced its last at {last_fence}, its \
                 session expired at {expiry}"
            );
        }
    }
    if env.paused {
        // One trust deadline for the node: every group fenced at the same instant.
        let first_fence = GROUPS
            .iter()
            .flat_map(|&g| nodes.events_of(a, g))
            .filter(|(t, e)| {
                *t >= cut_at
                    && matches!(
                        e,
                        OwnershipEvent::Revoked {
                            reason: RevokeReason::Fenced,
                            ..
                        }
                    )
            })
            .map(|(t, _)| t)
            .min()
            .expect("a fenced");
        assert_eq!(
            first_fence, last_fence,
            "the groups fenced at different times"
        );
    }
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.hang.store(false, Ordering::SeqCst);
    nodes
        .until_balanced(&GROUPS, 5 * RENEW, "a's shares back")
        .await;
    nodes.shutdown().await;
}
