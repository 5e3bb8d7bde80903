//! The messages this client wrote for its leases: remembered, so that a renewal is guarded by
//! the last one; and the lease just won.

use super::bucket::Bucket;
use super::NatsStore;
use crate::store::{Acquire, Lease};

/// A message this client wrote for a lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    pub(super) seq: u64,
    pub(super) acquired_ms: u64,
}

pub(super) fn lease_key(lease: &Lease) -> (String, String, u64) {
    (lease.lock.clone(), lease.identity.clone(), lease.token)
}

impl NatsStore {
    /// Remember (or forget) the last message written for a lease.
    pub(super) fn remember(&self, lease: &Lease, last: Option<Written>) {
        let mut written = self.written.lock().unwrap();
        match last {
            Some(last) => written.insert(lease_key(lease), last),
            None => written.remove(&lease_key(lease)),
        };
    }

    /// Forget the last message written for a lease if it is still `seq`: a renewal that ran
    /// beside this one may have written a newer one meanwhile.
    pub(super) fn forget(&self, lease: &Lease, seq: u64) {
        let mut written = self.written.lock().unwrap();
        if written.get(&lease_key(lease)).is_some_and(|w| w.seq == seq) {
            written.remove(&lease_key(lease));
        }
    }

    /// The lease just won: remembered for its renewals; no more waiting.
    pub(super) fn won(&self, bucket: &Bucket, lease: Lease, written: Written) -> Acquire {
        self.remember(&lease, Some(written));
        // A holder waits for nothing: its watch would only bring its own renewals.
        self.stop_watching();
        match bucket.choria() {
            // As a Choria campaigner wins: trusted only after the cool-down and an update.
            Some(choria) => Acquire::Confirm { lease, after: choria.cool_down() },
            None => Acquire::Won(lease),
        }
    }
}
