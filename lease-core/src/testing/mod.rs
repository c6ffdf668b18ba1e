//! Test support shared by every backend (feature `testing`).
//!
//! - [`conformance`]: one async function per rule of the [`LeaseStore`](crate::LeaseStore)
//!   contract, and the [`conformance_suite!`](crate::conformance_suite) macro that runs them
//!   all against a backend, each as its own test.
//! - [`model`]: the reference model, the contract as plain synchronous code.
//! - [`differential`]: random operation sequences run on the model and on real stores in
//!   lockstep (proptest-state-machine), comparing every result and checking invariants.
//! - [`faults`]: a fault-injecting store wrapper and a clock following tokio's paused time.

pub mod conformance;
pub mod differential;
pub mod faults;
pub mod model;

pub use crate::ownership_log::{OwnershipLog, RecordingHandler, Summary};
pub use faults::{Faults, FaultyStore, TokioClock};
pub use model::Model;
