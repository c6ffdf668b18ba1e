//! Deterministic interleavings of renewals, claims, joins and views on Postgres, with the
//! server's clock, one connection per side, for each concurrency rule in docs/postgres.md.
//! Each step waits for a condition the server reports (a backend blocked on a lock, the server
//! clock past an expiry), never for a guessed time. In every interleaving of a renewal and a
//! claim exactly one side owns the buckets.
//!
//! One test binary (`cargo test -p lease-diesel --test races`), a module per rule family;
//! `duel` holds the two-connection fixture and `members` the group the races run in.

mod duel;
mod members;

mod claims;
mod controls;
mod fencing;
mod hand_over;
mod history;
mod loads;
mod renewals;
mod resize;
mod sessions;
mod views;
