//! `changed` for the etcd store: a waiting campaign's place in the lock's queue and its watch,
//! kept across calls (see `queue` for whose turn it is, and why).
//!
//! What a waiting store sends: at its first wait, a lease for its queue entry, one transaction
//! (the entry, the lock key and the queue as of one revision) and one watch stream with two
//! watchers (the lock key, the queue) from the next revision. Then nothing while it waits,
//! releases and new holders included: every change reaches it on the watch. When it waits
//! again after `REFRESH_AFTER` (the elector's safety-net re-read, once a minute), one
//! keep-alive for the entry's lease: no timer of its own, so that a store nobody calls
//! `changed` on lets its entry lapse.

use std::sync::PoisonError;

use futures_util::FutureExt;
use tokio::time::{sleep_until, Instant};
use tonic::{Status, Streaming};

use super::client::store_error;
use super::queue::{entry_key, Line, Turn, QUEUE_TTL, REFRESH_AFTER};
use super::wire::{self, KeyValue, TxnRequest, TxnResponse, WatchResponse};
use super::EtcdStore;
use crate::store::{Result, StoreError};

/// What a waiting campaign keeps between `changed` calls on one lock.
pub(super) struct Waiting {
    pub lock: String,
    /// Its queue entry, once it has one.
    place: Option<Place>,
    /// The open watch and what it has shown (none before the first wait, or after it ended).
    watch: Option<Watch>,
    /// The last `changed` returned because this store was first in line at a release: the
    /// next acquire expects a free lock and writes at once. Otherwise (its turn came only
    /// after waiters ahead let it pass, or the caller re-reads on its own schedule) the lock
    /// may well be held, and the acquire reads before it grants a lease it would revoke.
    pub woke: bool,
    /// The entries that were ahead at the release this store acts on and let it pass: an
    /// acquire that wins deletes them with this store's own entry, so that a dead waiter
    /// costs the ones behind it one stagger, once.
    pub passed: Vec<Vec<u8>>,
}

/// A queue entry: its key, and the etcd lease it lives on.
pub(super) struct Place {
    pub lease_id: i64,
    pub key: Vec<u8>,
    /// When the lease was last known to be alive (read before the request that showed it).
    pub confirmed: Instant,
}

struct Watch {
    stream: Streaming<WatchResponse>,
    line: Line,
}

impl Waiting {
    fn new(lock: &str) -> Self {
        Self { lock: lock.to_string(), place: None, watch: None, woke: false, passed: Vec::new() }
    }

    /// The keys an acquire that wins deletes in its transaction: this store's entry and the
    /// entries it passed.
    pub fn leaving(&self) -> Vec<Vec<u8>> {
        self.place.iter().map(|p| p.key.clone()).chain(self.passed.iter().cloned()).collect()
    }

    /// An acquire read the lock held at `revision`: see `Line::held_at`.
    pub fn held_at(&mut self, revision: i64) {
        if let Some(watch) = &mut self.watch {
            watch.line.held_at(revision);
        }
    }

    /// The entry's lease, for the winner to revoke once it no longer needs to wait.
    pub fn into_place(self) -> Option<Place> {
        self.place
    }
}

/// Take in the messages that came while no `changed` was waiting; whether the watch goes on.
fn drain(open: &mut Watch) -> std::result::Result<bool, Status> {
    while let Some(message) = open.stream.message().now_or_never() {
        if !absorb(&mut open.line, message)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the watch goes on after one message (`false`: cancelled or ended; the caller re-reads).
fn absorb(
    line: &mut Line,
    message: std::result::Result<Option<WatchResponse>, Status>,
) -> std::result::Result<bool, Status> {
    match message? {
        Some(answer) if answer.canceled => Ok(false),
        Some(answer) => {
            let now = Instant::now();
            for event in &answer.events {
                line.see(event, now);
            }
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The waiting slot, as an acquire and a release see it.
impl EtcdStore {
    /// Whether this store waits on `lock` and its last wait did not end with it first in line
    /// at a release: the lock is then most likely still held, and an acquire reads before it
    /// grants a lease (which it would have to revoke).
    pub(super) fn quietly_watching(&self, lock: &str) -> bool {
        match self.waiting.try_lock() {
            Ok(slot) => slot.as_ref().is_some_and(|w| w.lock == lock && !w.woke),
            Err(_) => false,
        }
    }

    /// The queue keys an acquire of `lock` deletes if it wins: this store's entry and those it
    /// passed (none if it does not wait on `lock`).
    pub(super) fn leaving(&self, lock: &str) -> Vec<Vec<u8>> {
        match self.waiting.try_lock() {
            Ok(slot) => slot.as_ref().filter(|w| w.lock == lock).map(Waiting::leaving).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// An acquire found `lock` held in a read at `revision`: if this store waits on it, the
    /// turn its watch may still show as open is over.
    pub(super) fn note_held(&self, lock: &str, revision: Option<i64>) {
        if let (Ok(mut slot), Some(revision)) = (self.waiting.try_lock(), revision) {
            if let Some(waiting) = slot.as_mut().filter(|w| w.lock == lock) {
                waiting.held_at(revision);
            }
        }
    }

    /// A waiting campaign is over (this store holds the lock now): close the watch, and keep
    /// the queue entry's lease to revoke at release.
    pub(super) fn stop_watching(&self) {
        if let Ok(mut slot) = self.waiting.try_lock() {
            if let Some(place) = slot.take().and_then(Waiting::into_place) {
                *self.spent.lock().unwrap_or_else(PoisonError::into_inner) = Some(place);
            }
        }
    }

    /// The lease of this store's spent queue entry, if any (once).
    pub(super) fn spent(&self) -> Option<Place> {
        self.spent.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl EtcdStore {
    fn queue_prefix(&self, lock: &str) -> Vec<u8> {
        format!("{}queue/{lock}/", self.prefix).into_bytes()
    }

    fn queue_refused(&self) -> bool {
        self.queue_refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The cluster refuses the queue keys (a role that covers only the lock and token keys):
    /// this store waits without a queue from now on, acting at every release as all waiters
    /// did before there was one.
    fn refuse_queue(&self, why: &StoreError) {
        tracing::warn!("waiting without a queue: {}", why.message);
        self.queue_refused.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Revoke a queue entry's lease (deleting the entry), if it may still exist. Best effort:
    /// it lapses by itself.
    pub(super) async fn leave(&self, place: Option<Place>) {
        if let Some(place) = place.filter(|p| p.confirmed.elapsed() < QUEUE_TTL) {
            self.revoke_lease(place.lease_id).await;
        }
    }

    /// Give up the place in `lock`'s queue, if this store waits for that lock (`Store::stop_waiting`).
    pub(super) async fn leave_queue(&self, lock: &str) {
        let mut slot = self.waiting.lock().await;
        if slot.as_ref().is_some_and(|w| w.lock == lock) {
            let place = slot.take().and_then(Waiting::into_place);
            self.leave(place).await;
        }
    }

    /// Return when it may be this store's turn: the lock key deleted and no live waiter ahead,
    /// or those ahead let their stagger go by (see `queue`); or the watch ended (the caller
    /// re-reads). The watch and the entry are kept across calls (one lock per store).
    pub(super) async fn wait_turn(&self, lock: &str) -> Result<()> {
        let mut slot = self.waiting.lock().await;
        if slot.as_ref().is_some_and(|w| w.lock != lock) {
            let other = slot.take().and_then(Waiting::into_place);
            self.leave(other).await;
        }
        let waiting = slot.get_or_insert_with(|| Waiting::new(lock));
        waiting.woke = false;
        waiting.passed.clear();
        let Waiting { place, watch, woke, passed, .. } = waiting;
        // What came while the caller was away: a turn may have come and gone.
        let drained = match watch.as_mut() {
            Some(open) => drain(open),
            None => Ok(true),
        };
        match drained {
            Ok(true) => {}
            Ok(false) => {
                *watch = None;
                return Ok(());
            }
            Err(status) => {
                *watch = None;
                return Err(store_error(&self.shown, &status));
            }
        }
        self.refresh(place).await;
        match watch {
            Some(open) => self.rejoin(lock, place, &mut open.line).await?,
            None => *watch = Some(self.open_watch(lock, place).await?),
        }
        let Some(open) = watch.as_mut() else { return Ok(()) };
        loop {
            let until = match open.line.turn(Instant::now()) {
                Turn::Go { passed: let_pass } => {
                    *woke = let_pass.is_empty();
                    *passed = let_pass;
                    return Ok(());
                }
                Turn::Wait { until } => until,
            };
            let message = match until {
                Some(until) => tokio::select! {
                    message = open.stream.message() => message,
                    () = sleep_until(until) => continue,
                },
                None => open.stream.message().await,
            };
            match absorb(&mut open.line, message) {
                Ok(true) => {}
                Ok(false) => break,
                Err(status) => {
                    *watch = None;
                    return Err(store_error(&self.shown, &status));
                }
            }
        }
        *watch = None;
        Ok(())
    }

    /// Set up the wait: join the queue (or keep the place this store had: a put on an existing
    /// entry keeps its create revision), read the lock key and the queue at the same revision,
    /// and watch both from the next one, so that nothing between the read and the watch is
    /// missed.
    async fn open_watch(&self, lock: &str, place: &mut Option<Place>) -> Result<Watch> {
        let (lock_key, queue) = (self.lock_key(lock).into_bytes(), self.queue_prefix(lock));
        let (read, entries) = self.join(place, &queue, vec![wire::get(&lock_key)]).await?;
        let from = read.header.as_ref().map_or(0, |h| h.revision) + 1;
        let mut creates =
            vec![wire::WatchCreateRequest { key: lock_key.clone(), range_end: vec![], start_revision: from }];
        if entries.is_some() {
            let range_end = wire::prefix_range(&queue).range_end;
            creates.push(wire::WatchCreateRequest { key: queue.clone(), range_end, start_revision: from });
            // The second watcher is a second request on the same stream.
            tracing::trace!(op = "watch", "store request");
        }
        // Opening the stream is bounded like any call; waiting on it is bounded by the caller.
        let stream = self.call("watch", self.connection.watch(creates)).await?;
        let mine = place.as_ref().filter(|_| entries.is_some()).map(|p| p.key.clone());
        let mut line = Line::new(lock_key, queue, mine, from - 1);
        line.load(entries.as_deref().unwrap_or(&[]));
        if read.range(0).is_empty() {
            line.lock_freed(Instant::now());
        }
        Ok(Watch { stream, line })
    }

    /// Keep this store's entry alive if its lease was last confirmed `REFRESH_AFTER` ago: at
    /// the safety net's cadence, never while releases wake it. A lapsed lease is forgotten (a
    /// new one is granted when the entry is put back).
    async fn refresh(&self, place: &mut Option<Place>) {
        let Some(held) = place.as_mut().filter(|p| p.confirmed.elapsed() >= REFRESH_AFTER) else { return };
        let asked = Instant::now();
        match self.keep_alive(held.lease_id).await {
            Ok(true) => held.confirmed = asked,
            Ok(false) => *place = None,
            // Tried again at the next wait; the entry lives on meanwhile.
            Err(_) => {}
        }
    }

    /// Before waiting on an open watch: put this store's entry back if it is gone (its lease
    /// lapsed, or a waiter that took the lock in its turn deleted it as passed). While it is
    /// in line, nothing is sent.
    async fn rejoin(&self, lock: &str, place: &mut Option<Place>, line: &mut Line) -> Result<()> {
        if self.queue_refused() || place.is_some() && line.in_queue() {
            return Ok(());
        }
        // An entry whose lease lapsed is gone, whether or not the watch has shown it yet.
        line.leave();
        let (_, entries) = self.join(place, &self.queue_prefix(lock), Vec::new()).await?;
        let mine = place.as_ref().zip(entries).and_then(|(p, entries)| {
            entries.iter().find(|kv| kv.key == p.key).map(|kv| (p.key.clone(), kv.create_revision))
        });
        if let Some((key, create_revision)) = mine {
            // Only this store's own entry is taken from the read: the watch may still carry
            // older events of the others, and a newer snapshot would be overwritten by them.
            line.joined(key, create_revision);
        }
        Ok(())
    }

    /// Put this store's entry in the lock's queue (granting its lease first if it has none),
    /// in one transaction after `reads`, whose answers come first; the queue is read last, so
    /// it includes the entry. Returns the answer and the queue's entries, or `None` for them
    /// when the cluster refuses the queue keys (then only `reads` are sent, now and from then
    /// on). A failed write forgets the entry's lease: it lapses by itself, and the next wait
    /// starts with a new one.
    async fn join(
        &self,
        place: &mut Option<Place>,
        queue: &[u8],
        reads: Vec<wire::RequestOp>,
    ) -> Result<(TxnResponse, Option<Vec<KeyValue>>)> {
        let only_reads = |reads: Vec<wire::RequestOp>| async move {
            if reads.is_empty() {
                return Ok((TxnResponse::default(), None));
            }
            Ok((self.txn("wait", TxnRequest { success: reads, ..Default::default() }).await?, None))
        };
        if self.queue_refused() {
            return only_reads(reads).await;
        }
        if place.is_none() {
            let asked = Instant::now();
            match self.grant(QUEUE_TTL).await {
                Ok(lease_id) => *place = Some(Place { lease_id, key: entry_key(queue, lease_id), confirmed: asked }),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    self.refuse_queue(&e);
                    return only_reads(reads).await;
                }
            }
        }
        let Some(entry) = place.as_ref() else { return only_reads(reads).await };
        let n = reads.len();
        let mut ops = reads.clone();
        ops.push(wire::put(&entry.key, Vec::new(), entry.lease_id));
        ops.push(wire::get_prefix(queue));
        match self.txn("wait", TxnRequest { success: ops, ..Default::default() }).await {
            Ok(resp) => {
                let entries = resp.range(n + 1).to_vec();
                Ok((resp, Some(entries)))
            }
            Err(e) => {
                let lost = place.take();
                if e.is_transient() {
                    return Err(e);
                }
                self.refuse_queue(&e);
                self.leave(lost).await;
                only_reads(reads).await
            }
        }
    }
}
