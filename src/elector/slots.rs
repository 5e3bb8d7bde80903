//! Campaigning for a lock's slots (`--slots N`, `crate::slots`): one slot after the other,
//! lowest first, in a one-shot run; every slot at once in a waiting one, which takes the
//! first that frees. Each slot is a lock of its own to the campaign (`campaign_slot`), so a
//! slot's release wakes the standbys the way a plain lock's does: no herd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::timeout;

use super::{Elector, Mode, Outcome, Won};
use crate::slots::SlotStore;
use crate::store::Store;

impl Elector {
    /// Campaign for the lock (every slot of it). The winning slot's store then holds the lease;
    /// the others' stores are closed, which takes this run out of their standbys' queues.
    pub(super) async fn campaign(&mut self) -> Result<Won, Outcome> {
        let slots: Vec<Arc<dyn Store>> = (0..self.election.slots).map(|slot| self.slot_store(slot)).collect();
        let won = match self.election.mode {
            Mode::Wait { .. } if slots.len() > 1 => self.campaign_for_all(&slots).await,
            _ => self.campaign_in_turn(&slots).await,
        };
        self.slot_stores.clear();
        let won = won?;
        self.store = slots[won.slot].clone();
        Ok(won)
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
                Ok((lease, sent)) => return Ok(Won { lease, sent, slot }),
                Err(Outcome::Conflict(record)) if slot + 1 < slots.len() => {
                    if let Some(record) = &record {
                        tracing::debug!(slot, holder = record.holder.as_deref().unwrap_or("-"), "slot is held");
                    }
                    held = record.or(held);
                }
                Err(Outcome::Conflict(record)) => return Err(Outcome::Conflict(record.or(held))),
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
        let left: Vec<usize> =
            (0..slots.len()).filter(|&other| other != slot && granted[other].load(Ordering::SeqCst)).collect();
        if !left.is_empty() {
            self.give_back_slots(slots, &left, result.is_ok()).await;
        }
        result.map(|(lease, sent)| Won { lease, sent, slot })
    }

    /// Free the slots in `left` if an acquire still on its way when their campaigns were dropped
    /// gave them to this run. While a child is about to start this goes on beside it; on the way
    /// out (a signal, --timeout) the run waits for it, briefly.
    async fn give_back_slots(&self, slots: &[Arc<dyn Store>], left: &[usize], starting: bool) {
        if !self.election.unique_identity {
            tracing::debug!("an acquire for another slot was under way; with a chosen --identity it is left to expire");
            return;
        }
        let bound = self.timing().request_timeout().min(Duration::from_secs(1));
        let (lock, identity) = (self.election.lock.clone(), self.election.identity.clone());
        let giving_back: Vec<_> = left
            .iter()
            .map(|&slot| {
                let (store, lock, identity) = (slots[slot].clone(), lock.clone(), identity.clone());
                async move {
                    match timeout(bound, store.abandon(&lock, &identity)).await {
                        Ok(Ok(())) => tracing::debug!(slot, "gave back any lease the slot's acquire got"),
                        _ => tracing::debug!(slot, "could not check the slot for a lease its acquire got"),
                    }
                }
            })
            .collect();
        let all = futures_util::future::join_all(giving_back);
        if starting {
            tokio::spawn(all);
        } else {
            all.await;
        }
    }
}
