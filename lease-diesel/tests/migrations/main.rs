//! The migration runner and the start-up check on real Postgres: the engine owns its schema
//! (refuses one it did not make, reverts only its own objects), keeps its versions out of the
//! application's diesel table (and adopts a deployment of the earlier release that kept them
//! there), checks without writing (on a read-only connection, as a SELECT-only role), lets a
//! role with EXECUTE alone fence, and reports connection failures with their cause and
//! whether to retry. Roles are made with exactly the grants each test is about.
//!
//! One test binary (`cargo test -p lease-diesel --test migrations`), a module per family;
//! `db` and `roles` hold what the families share.

#[path = "../support/mod.rs"]
mod support;

mod db;
mod roles;

mod compatibility;
mod connect_failures;
mod fencing;
mod ownership;
mod privileges;
mod startup_check;
mod upgrades;
mod versions;
