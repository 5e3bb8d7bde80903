//! leaderrun: run a command only while holding a named leader lease in a shared store.
//!
//! The layers, each unaware of the ones beside it:
//! - `cli`: every flag, defined once with its documentation;
//! - `timing`: every timing rule, validated in one place;
//! - `elector`: the campaign / lead / renew state machine (no I/O, clock injected);
//! - `store`: one trait, one file per store;
//! - `slots`: `--slots N`, N locks under one name, above the store trait;
//! - `child`: process group, signals, kill escalation, the watchdog;
//! - `observe`: what a run reports about itself (the child's lease file, health, metrics);
//! - `run`: wires them together for the binary.

pub mod child;
pub mod cli;
pub mod clock;
pub mod elector;
pub mod exit;
pub mod logging;
pub mod observe;
pub mod payload;
pub mod run;
pub mod slots;
pub mod store;
pub mod timing;

// Lets the conformance suite in tests/, written against `leaderrun::store`, also run
// inside the crate against the in-memory stores on tokio's paused clock.
#[cfg(test)]
extern crate self as leaderrun;
