//! Leases this run won but may not use yet, or will not use: a store's cool-down waited out
//! and confirmed (`Acquire::Confirm`), and leases given back (unused, or granted to an
//! acquire whose outcome the run never learnt).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::{Election, Elector, Mode, Outcome, Unconfirmed};
use crate::clock::sleep_until;
use crate::store::{Lease, LockRecord, Renew, Store, StoreError};

impl Elector {
    /// Wait out a store's cool-down after a won write (`Acquire::Confirm`), then confirm the
    /// lease with a renewal: the way Choria's campaigners win, so that a leader evicted just
    /// after its own renewal has noticed it (at its next one) before this run's child starts.
    /// Returns the lease and the instant the confirming renewal was sent, which anchors the
    /// deadline. A lease that will not be used is given back.
    pub(super) async fn confirm(
        &self,
        store: &Arc<dyn Store>,
        lease: Lease,
        after: Duration,
    ) -> Result<(Lease, Duration), Unconfirmed> {
        let timing = self.timing();
        let give_up = match self.election.mode {
            Mode::Wait { until } => until,
            // A one-shot run's --timeout bounds only its watch of a client-timed lease.
            Mode::OneShot { .. } => None,
        };
        let ready = self.now() + after;
        tracing::debug!(token = lease.token, cool_down = ?after, "won; confirming after the store's cool-down");
        let clock = self.clock.clone();
        let until = give_up.map_or(ready, |t| t.min(ready));
        tokio::select! {
            _ = async move { sleep_until(&*clock, until).await } => {}
            Some(signal) = self.signal() => {
                self.give_back(store, &lease).await;
                return Err(Unconfirmed::Ended(Outcome::Interrupted(signal)));
            }
        }
        if self.now() < ready {
            // --timeout ran out first: the turn never came.
            self.give_back(store, &lease).await;
            return Err(Unconfirmed::Ended(Outcome::Conflict(None)));
        }
        let sent = self.now();
        let (store_, held) = (store.clone(), lease.clone());
        let renewal = timeout(timing.request_timeout(), async move { store_.renew(&held, timing.store_ttl()).await });
        let answer = tokio::select! {
            answer = renewal => answer,
            Some(signal) = self.signal() => {
                self.give_back(store, &lease).await;
                return Err(Unconfirmed::Ended(Outcome::Interrupted(signal)));
            }
        };
        let failure = match answer {
            Ok(Ok(Renew::Renewed)) => return Ok((lease, sent)),
            Ok(Ok(Renew::Lost(record))) => {
                tracing::debug!(token = lease.token, "the lease was lost during the cool-down");
                // Revoked (`leaderrun release`) while cooling down, the entry is still this
                // run's: nobody else may free it, and it would keep the lock for the store's
                // whole lifetime of an entry. An entry taken since by another is left alone.
                self.give_back(store, &lease).await;
                return Err(Unconfirmed::Lost(record));
            }
            Ok(Err(err)) => err,
            Err(_) => StoreError::unavailable(format!(
                "the store did not confirm the lease within {}",
                humantime::format_duration(timing.request_timeout())
            )),
        };
        self.give_back(store, &lease).await;
        Err(Unconfirmed::Failed(failure))
    }

    /// Whether `record` is held under this run's identity.
    pub(super) fn is_own(&self, record: &LockRecord) -> bool {
        record.holder.as_deref() == Some(self.election.identity.as_str())
    }

    /// Best effort, briefly: free a lease this run won but will not use (its `release` leaves
    /// a lease taken since by another alone).
    pub(super) async fn give_back(&self, store: &Arc<dyn Store>, lease: &Lease) {
        let bound = self.timing().request_timeout().min(Duration::from_secs(1));
        match timeout(bound, store.release(lease, Duration::ZERO)).await {
            Ok(Ok(())) => tracing::debug!(token = lease.token, "gave the unused lease back"),
            Ok(Err(err)) => tracing::debug!("could not give the unused lease back (it will expire): {err}"),
            Err(_) => tracing::debug!("giving the unused lease back timed out (it will expire)"),
        }
    }

    /// Best effort, after an acquire whose answer never came: free the lock if the store
    /// granted it to this run after all. Only with an identity no other run can have.
    /// Returns whether the give-back reached the store.
    pub(super) async fn abandon(&self, store: &Arc<dyn Store>) -> bool {
        let Election { lock, identity, unique_identity, .. } = &self.election;
        if !unique_identity {
            tracing::debug!("an acquire went unanswered; with a chosen --identity it cannot be told from another run's, so it is left to expire");
            return false;
        }
        // Short: this runs on the way out of a wait (a signal) or between attempts.
        let bound = self.timing().request_timeout().min(Duration::from_secs(1));
        match timeout(bound, store.abandon(lock, identity)).await {
            Ok(Ok(())) => {
                tracing::debug!("gave back any lease the unanswered acquire got");
                return true;
            }
            Ok(Err(err)) => tracing::debug!("could not check for a lease the unanswered acquire got: {err}"),
            Err(_) => tracing::debug!("checking for a lease the unanswered acquire got timed out"),
        }
        false
    }
}
