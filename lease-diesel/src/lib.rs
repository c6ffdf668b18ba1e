//! `lease-diesel`: the Postgres backend of the lease engine (in progress; see issue 3).

#![warn(missing_docs)]
