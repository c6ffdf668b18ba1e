//! Adding a group to a machine the way a store that has it answers: the machine's first calls
//! for a group are its ensure and its subscription.

use std::time::Instant;

use lease_core::{GroupName, ShardCount};
use lease_worker::machine::{Input, Machine, Output, StoreCall};

/// Add `group` to `m` and answer its admission calls (the group exists with `shards`, no
/// feed), as the next outputs of a machine with no call in flight. Panics if the machine
/// refuses the group or asks for something else first.
pub fn admit(m: &mut Machine, now: Instant, group: GroupName, shards: ShardCount) {
    assert!(m.add_group(group.clone(), shards), "{group} refused");
    for _ in 0..2 {
        match m.poll(now) {
            Some(Output::Call(StoreCall::EnsureGroup { group: g, .. })) => {
                m.handle(now, Input::Ensured(g, Ok(())));
            }
            Some(Output::Call(StoreCall::Subscribe { group: g })) => {
                m.handle(now, Input::Subscribed(g, Ok(())));
            }
            other => panic!("{group}: expected its ensure and subscription, got {other:?}"),
        }
    }
}
