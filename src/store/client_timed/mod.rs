//! The core every client-timed store stands on (DESIGN.md §8): Kubernetes Leases today,
//! object stores next. Such a store has no server-side expiry, so nothing in it ever ends
//! a lease. This file owns every timing rule once; each store is a small file of record
//! I/O behind `Records` (read, create, replace if unchanged, list, wait for a change),
//! the split client-go makes between `leaderelection` and `resourcelock`.
//!
//! The rules:
//! - A standby takes a held record only after it has itself seen that exact version
//!   unchanged for `ttl·(1+2ρ) + margin` on its own elapsed-time clock (`sightings.rs`), or
//!   at once when the record says it was released (an empty holder, as client-go's
//!   ReleaseOnCancel leaves it). No clock is compared with another machine's. A first
//!   sight of a held record is answered `Acquire::Unproven`: nothing is known yet of its
//!   holder, so a one-shot run may watch it for up to one such observation (bounded by
//!   `--timeout`) and gives up as soon as it sees the record change (`Acquire::Held`).
//! - The holder's deadline is the elector's, as on every store: anchored at the send time
//!   of the last confirmed write. Its records carry `ttl_seconds` = the ttl rounded UP to
//!   whole seconds, so a standby never waits less than the holder's lease.
//! - Fencing tokens. The acquiring write carries `token = max(previous token, floor) + 1`,
//!   where `floor` is what the read reports as at least every token written before it.
//!   On Kubernetes the floor is the resourceVersion: an etcd revision, which grows with
//!   every write in the cluster and is never reused, so a token stays larger than all
//!   before it across releases, takeovers by client-go (which writes no token) and a
//!   `kubectl delete lease` (which loses the record and its token, but not the revision).
//!   A store with no such number (floor 0) keeps the chain only while the record lives.
//!   A create is the one write that sees no previous token, and it may land long after
//!   its read (a slow network, a paused host, a client's retry), after another run's record
//!   was made, held and deleted meanwhile. So the store reports with each create a floor
//!   of its own (the create's revision, or its server second), and a create whose token is
//!   not above it is rewritten with a token that is, in one write guarded by the create's
//!   version, before it counts (`ClientTimed::above`). Where the floor is the server's
//!   second, a token above the floor of the second it was written in counts only once that
//!   second is over, whichever write carried it (`Records::counts`; `ClientTimed::settled`
//!   reads until then): a takeover of a record whose create never counted carries one.
//! - A --min-hold keep leaves the record held (client-go sees a holder whose lease lasts
//!   the keep) and notes `kept_until` on the store server's clock (its HTTP `Date`), so
//!   the next cron firing takes it at once on whichever host fires first, and a late host
//!   of the same firing does not. A store that reports no server clock is judged on this
//!   host's wall clock instead, and says so.
//! - A waiting standby keeps one watch open on the lock where the store can watch
//!   (`watchers.rs`): it re-judges the latest record the watch brought instead of reading
//!   it again, so while the holder lives it makes no request beyond the watch. Where the
//!   store cannot watch, polls feed the same machinery (`polls.rs`): one read a poll, and
//!   none after it.
//! - `revoke` marks the record; the holder sees it at its next renewal, stops its child and
//!   releases. Nobody else may take a revoked record before that (it changed, so standbys
//!   watch it afresh). A kept record (no child runs under it) is freed at once.

pub mod document;
pub mod object_names;
mod polls;
mod records;
pub mod server_clock;
mod sightings;
mod store;
mod watchers;

#[cfg(test)]
pub mod memory;
#[cfg(test)]
mod tests;

pub use records::{Created, Feed, Found, Read, Record, Records, Version, Written};
pub use sightings::observation;
pub use store::ClientTimed;

use std::sync::Arc;

use super::Store;

/// The `Store` for a client-timed store's records, on the host's clocks.
pub fn client_timed(records: Arc<dyn Records>) -> Box<dyn Store> {
    Box::new(ClientTimed::new(records))
}
