//! Campaigning for a lock's slots (`--slots N`, `crate::slots`): one slot after the other,
//! lowest first, in a one-shot run; every slot at once in a waiting one, which takes the
//! first that frees. Each slot is a lock of its own to the campaign (`campaign_slot`), so a
//! slot's release wakes the standbys the way a plain lock's does: no herd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::timeout;

use super::{Election, Elector, Mode, Outcome, Won};
use crate::slots::SlotStore;
use crate::store::Store;

impl Elector {
    /// Campaign for the lock (every slot of it). The winning slot's store then holds the lease
    /// (`Won::store`); the run's own store and its slots' stay as they are, for a campaign
    /// again should the child start too late (`lead` closes the other slots' stores once the
    /// child runs).
    pub(super) async fn campaign(&mut self) -> Result<Won, Outcome> {
        let slots: Vec<Arc<dyn Store>> = (0..self.election.slots).map(|slot| self.slot_store(slot)).collect();
        match self.election.mode {
            Mode::Wait { .. } if slots.len() > 1 => self.campaign_for_all(&slots).await,
            _ => self.campaign_in_turn(&slots).await,
        }
    }

    /// The store slot `slot` is campaigned for through: the run's store itself for a plain lock.
    fn slot_store(&self, slot: usize) -> Arc<dyn Store> {
        if self.election.slots == 1 {
            return self.store.clone();
        }
        let own = slot.checked_sub(1).and_then(|i| self.slot_stores.get(i));
        Arc::new(SlotStore::new(own.unwrap_or(&self.store).clone(), slot))
    }

    /// One slot after the other, lowest first: a one-shot run ends at the first it wins, or
    /// with a conflict when every slot is held (the last slot's holder said).
    async fn campaign_in_turn(&self, slots: &[Arc<dyn Store>]) -> Result<Won, Outcome> {
        let granted = AtomicBool::new(false);
        let mut held = None;
        for (slot, store) in slots.iter().enumerate() {
            match self.campaign_slot(store, &granted).await {
                Ok((lease, sent)) => return Ok(Won { lease, sent, slot, store: store.clone() }),
                Err(Outcome::Conflict(record)) => {
                    if let Some(record) = &record {
                        tracing::debug!(slot, holder = record.holder.as_deref().unwrap_or("-"), "slot is held");
                    }
                    held = record.or(held);
                }
                Err(outcome) => return Err(outcome),
            }
        }
        Err(Outcome::Conflict(held))
    }

    /// Every slot at once: the first campaign to end decides (a win, a signal, --timeout, a
    /// store that refuses). The others are dropped where they are; a lease one of them may
    /// have been granted meanwhile (its acquire was on its way) is given back.
    async fn campaign_for_all(&self, slots: &[Arc<dyn Store>]) -> Result<Won, Outcome> {
        let granted: Vec<AtomicBool> = slots.iter().map(|_| AtomicBool::new(false)).collect();
        let first = {
            let mut campaigns: FuturesUnordered<_> = slots
                .iter()
                .zip(&granted)
                .enumerate()
                .map(|(slot, (store, granted))| async move { (slot, self.campaign_slot(store, granted).await) })
                .collect();
            campaigns.next().await
        };
        let Some((slot, result)) = first else {
            return Err(Outcome::Conflict(None));
        };
        let others: Vec<(usize, bool)> = (0..slots.len())
            .filter(|&other| other != slot)
            .map(|other| (other, granted[other].load(Ordering::SeqCst)))
            .collect();
        self.leave_slots(slots, &others, result.is_ok()).await;
        result.map(|(lease, sent)| Won { lease, sent, slot, store: slots[slot].clone() })
    }

    /// Leave the slots in `others`, whose campaigns were dropped: give up the place each kept
    /// among its standbys (`Store::stop_waiting`), or the standbys behind it would wait it out;
    /// and free the slot if an acquire still on its way gave it to this run (`true`). While a
    /// child is about to start this goes on beside it; on the way out (a signal, --timeout) the
    /// run waits for it, briefly.
    async fn leave_slots(&self, slots: &[Arc<dyn Store>], others: &[(usize, bool)], starting: bool) {
        let bound = self.timing().request_timeout().min(Duration::from_secs(1));
        let Election { lock, identity, unique_identity, .. } = &self.election;
        if !unique_identity && others.iter().any(|(_, granted)| *granted) {
            tracing::debug!("an acquire for another slot was under way; with a chosen --identity it is left to expire");
        }
        let leaving: Vec<_> = others
            .iter()
            .map(|&(slot, granted)| {
                let (store, lock, identity) = (slots[slot].clone(), lock.clone(), identity.clone());
                let give_back = granted && *unique_identity;
                let answered_by = self.timing().request_timeout();
                async move {
                    if give_back {
                        let give_back = || async {
                            match timeout(bound, store.abandon(&lock, &identity)).await {
                                Ok(Ok(())) => tracing::debug!(slot, "gave back any lease the slot's acquire got"),
                                _ => tracing::debug!(slot, "could not check the slot for a lease its acquire got"),
                            }
                        };
                        give_back().await;
                        // The dropped acquire may still be on its way (another connection, a
                        // queue on the server) and land after that: once more when its answer
                        // would have been too late to count anyway.
                        tokio::time::sleep(answered_by).await;
                        give_back().await;
                    }
                    let _ = timeout(bound, store.stop_waiting(&lock)).await;
                }
            })
            .collect();
        let all = futures_util::future::join_all(leaving);
        if starting {
            // Beside the child's start; the run waits for it before it ends (`finish_leaving`).
            self.leaving.lock().unwrap().push(tokio::spawn(async move {
                all.await;
            }));
        } else {
            all.await;
        }
    }

    /// Wait for the slots left beside the child's start (`leave_slots`): a child that ended
    /// first must not cut a give-back short, or the slot stays closed for a ttl with nothing
    /// running in it. Each step is bounded, so this is too.
    pub(super) async fn finish_leaving(&self) {
        let leaving: Vec<_> = std::mem::take(&mut *self.leaving.lock().unwrap());
        for handle in leaving {
            let _ = handle.await;
        }
    }
}
