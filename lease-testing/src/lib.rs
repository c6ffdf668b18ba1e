//! Test support every backend of the lease engine runs, written once.
//!
//! - [`conformance`]: one async function per rule of the [`LeaseStore`](lease_core::LeaseStore)
//!   contract, and the [`conformance_suite!`] macro that runs them all against a backend, each
//!   as its own test, with a guard that no case is missed.
//! - [`model`]: the reference model, the contract as plain synchronous code.
//! - [`differential`]: random operation sequences run on the model and on real stores in
//!   lockstep (proptest-state-machine), comparing every result and checking invariants.
//! - [`runtime`]: worker-level scenarios (cold start, join, graceful stop, crash, self-fencing,
//!   errors, misbehaving applications) on real workers, and the [`runtime_suite!`] macro that
//!   runs them all on a backend, on tokio's paused clock or on real time.
//! - [`balance_sim`]: a pool balancing skewed loads tick by tick, for the load policy's
//!   benchmark and property tests.
//! - [`faults`]: a fault-injecting store wrapper and a clock following tokio's paused time.
//! - [`RecordingHandler`]: a worker handler that records into an ownership log.
//! - [`Counters`]: a metrics recorder that counts what the worker reports.
//! - [`coverage`]: every overlap in an ownership log, and each bucket's time without a holder
//!   (failover tests and benchmarks).
//!
//! Backends depend on it as a dev-dependency only.

#![warn(missing_docs)]

pub mod balance_sim;
pub mod conformance;
pub mod counters;
pub mod coverage;
pub mod differential;
pub mod failover;
pub mod faults;
pub mod model;
mod recording;
pub mod runtime;

pub use counters::Counters;
pub use faults::{Faults, FaultyStore, TokioClock};
pub use lease_core::ownership_log::{OwnershipLog, Summary};
pub use model::Model;
pub use recording::RecordingHandler;

/// What the macros of this crate name; not part of its API.
#[doc(hidden)]
pub mod __private {
    pub use lease_core::ManualClock;
}
