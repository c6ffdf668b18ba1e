//! The lease engine's store on etcd: **in progress** (issue 16). What is here is what the
//! store will stand on, each piece tested on its own: the `etcd://` URL ([`EtcdUrl`]), the key
//! layout ([`keys`]) and the classification of the client's errors ([`classify`]). The design
//! is in `docs/ARCHITECTURE.md`, section "etcd".

mod error;
pub mod keys;
mod url;

pub use error::classify;
pub use url::{EtcdUrl, EtcdUrlError};
