//! Waiting for a lock without polling: a queue in the kernel beside the database.
//!
//! The holder of a lease also holds its lock name's byte of the sidecar file (see
//! `sidecar`); waiters queue for that byte, each in a thread of its own blocked in the
//! kernel. A release frees the byte after the database write, and the kernel hands it
//! to ONE waiter, which re-reads: a hundred waiters cost one wake-up per handoff, and an
//! idle standby costs nothing. A holder that dies drops the byte with its process.
//!
//! The waiter holding the byte (the head of the queue) is the one to take the lease
//! next. A holder without the byte (a one-shot run that won while the head waited, or any
//! holder while the head is frozen: a stopped process keeps its byte) writes to the sidecar
//! when it frees the lease, and every waiter watches the sidecar with inotify (a watch costs
//! nothing while nothing is written). The head then reads at once; a waiter behind it reads
//! a stagger later and tries only if the lock is still free (see `turn`). So a frozen head
//! costs each handoff one stagger; a live one takes the lock long before, and the others
//! only read it held.
//!
//! All of it is a hint. Every wait also ends when the lease it last read lapses (a
//! holder that hangs keeps its byte, and a lease lapses whatever the queue says), and
//! the caller then takes the lease only by the database's compare-and-set.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::sidecar::{self, Watch};
use super::turn;
use crate::clock::boottime;
use crate::store::{poll_until_free, Store};

/// How often a waiter polls when the sidecar cannot be used (no permission to open it,
/// a filesystem without OFD locks): local reads are cheap.
const POLL: Duration = Duration::from_millis(20);

/// How long a queue place is kept after a wait ends, for the caller's re-read and next
/// wait. After that a place nobody waits on is given up, so an abandoned wait (a
/// --timeout that ran out) does not hold up the waiters behind it.
const LINGER: Duration = Duration::from_secs(2);

/// Longest single sleep before the boot clock is read again: tokio's timers do not count
/// a suspend of the host, and a lease lapses during one.
const MAX_NAP: Duration = Duration::from_secs(10);

pub struct Wake {
    db: PathBuf,
    sidecar: PathBuf,
    /// Whether this client may create the sidecar (a run may; `status` and `release` only look).
    create: bool,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// When the lease this client last saw held lapses, per lock (boot clock), so that a
    /// wait after an acquire needs no read of its own.
    seen: Mutex<HashMap<String, Duration>>,
}

/// This client's place for one lock name: its own open of the sidecar.
struct Slot {
    file: Arc<File>,
    offset: i64,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the queue thread of a held byte when it may have to let it go.
    changed: Condvar,
    /// Wakes the waits when the queue thread got the byte (or failed).
    granted: tokio::sync::Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Idle,
    /// A thread is blocked in the kernel, queued for the byte.
    Queued,
    /// This client holds the byte.
    Held,
    /// The kernel refused to queue (no OFD locks here): waits poll.
    Broken,
}

#[derive(Default)]
struct State {
    phase: Phase,
    /// This client holds the lease: keep the byte until it is released.
    leased: bool,
    /// Waits under way.
    waiting: usize,
    /// Until when the byte is kept with nobody waiting (see `LINGER`).
    linger_until: Option<Instant>,
    /// The client is gone: let go of everything.
    closing: bool,
    /// Which queue thread is current: an older one that wakes late leaves.
    thread: u64,
}

impl State {
    fn wanted(&self, now: Instant) -> bool {
        !self.closing && (self.leased || self.waiting > 0 || self.linger_until.is_some_and(|t| t > now))
    }
}

fn state_of(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic elsewhere while holding it leaves plain flags: still usable.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Wake {
    pub fn new(db: &Path, create: bool) -> Self {
        Self {
            db: db.to_path_buf(),
            sidecar: sidecar::path_for(db),
            create,
            slots: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// This client's place for `lock`, opening the sidecar on first use; `None` when it
    /// cannot be opened (the caller then does without).
    fn slot(&self, lock: &str) -> Option<Arc<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get(lock) {
            return Some(slot.clone());
        }
        match sidecar::open(&self.sidecar, &self.db, self.create) {
            Ok(file) => {
                let shared = Arc::new(Shared {
                    state: Mutex::new(State::default()),
                    changed: Condvar::new(),
                    granted: tokio::sync::Notify::new(),
                });
                let slot = Arc::new(Slot { file: Arc::new(file), offset: sidecar::offset_of(lock), shared });
                slots.insert(lock.to_string(), slot.clone());
                Some(slot)
            }
            Err(err) => {
                tracing::debug!(sidecar = %self.sidecar.display(), "no wake-up file, waits will poll: {err}");
                None
            }
        }
    }

    /// This client won the lease: hold the lock's byte too, so that waiters stay blocked in
    /// the kernel until it is released (or this process dies). If another client holds the
    /// byte (a waiter at the head of the queue), the release will touch the sidecar instead.
    pub fn won(&self, lock: &str) {
        let Some(slot) = self.slot(lock) else { return };
        let mut state = state_of(&slot.shared.state);
        state.leased = true;
        state.linger_until = None;
        if state.phase == Phase::Idle {
            if let Ok(true) = sidecar::try_lock(&slot.file, slot.offset) {
                state.phase = Phase::Held;
            }
        }
    }

    /// This client saw the lease held, lapsing `left` from now.
    pub fn saw(&self, lock: &str, left: Duration) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(lock.to_string(), boottime() + left);
    }

    /// This client's lease was released (`freed`: the lock is free now, not kept for
    /// --min-hold). Called after the database write, so whoever wakes reads it released.
    pub fn released(&self, lock: &str, freed: bool) {
        let slot = self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(lock).cloned();
        if let Some(slot) = &slot {
            let mut state = state_of(&slot.shared.state);
            state.leased = false;
            state.linger_until = None;
            if state.phase == Phase::Held {
                // The kernel hands the byte to the next in the queue.
                sidecar::unlock(&slot.file, slot.offset);
                state.phase = Phase::Idle;
                slot.shared.changed.notify_all();
                return;
            }
        }
        if freed {
            self.touch(slot.as_deref());
        }
    }

    /// A lock was freed by this client without holding its byte (`revoke` of a kept lease):
    /// wake the head of the queue.
    pub fn freed(&self, lock: &str) {
        let slot = self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(lock).cloned();
        self.touch(slot.as_deref());
    }

    fn touch(&self, slot: Option<&Slot>) {
        let result = match slot {
            Some(slot) => sidecar::touch(&slot.file),
            // Nobody can be waiting on a sidecar that does not exist: never create it here.
            None => match sidecar::open(&self.sidecar, &self.db, false) {
                Ok(file) => sidecar::touch(&file),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(err),
            },
        };
        if let Err(err) = result {
            tracing::debug!("could not touch the wake-up file (waiters read at the lease's expiry): {err}");
        }
    }

    /// Return when the lock may have changed: this client reached the head of the queue
    /// (the holder let go of its byte), a release outside the queue was heard (at once at the
    /// head, a stagger later behind it, if the lock is still free then), or the lease last
    /// read lapsed; or after `max_wait`. Without a usable sidecar, poll.
    pub async fn changed(&self, store: &dyn Store, lock: &str, max_wait: Duration) {
        let deadline = tokio::time::Instant::now() + max_wait;
        let Some(slot) = self.slot(lock) else {
            return poll_until_free(store, lock, max_wait, POLL).await;
        };
        let _waiting = Waiting::begin(&slot);
        let mut lapse = self.seen.lock().unwrap_or_else(|p| p.into_inner()).remove(lock);
        let stagger = turn::stagger();
        let mut watch: Option<Watch> = None;
        let mut was_head = false;
        // When a release was heard behind the head (boot clock): read a stagger later.
        let mut heard: Option<Duration> = None;
        loop {
            let granted = slot.shared.granted.notified();
            tokio::pin!(granted);
            granted.as_mut().enable();
            let head = match slot.queue() {
                Phase::Held => true,
                Phase::Broken => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    return poll_until_free(store, lock, left, POLL).await;
                }
                _ => false,
            };
            if head && !was_head {
                // New at the head: read now, whatever was read or heard before.
                (lapse, heard) = (None, None);
            }
            was_head = head;
            if watch.is_none() && heard.is_none() {
                // Hear a release by a holder without the byte (outside the queue, or behind a
                // frozen head) through inotify. The watch first, then a read, so that no
                // release falls between unheard.
                match Watch::new(&self.sidecar) {
                    Ok(new) => {
                        watch = Some(new);
                        lapse = None;
                    }
                    Err(err) => tracing::debug!("no inotify watch (waiting for expiry instead): {err}"),
                }
            }
            let at = match lapse {
                Some(at) => at,
                None => match lapses_at(store, lock).await {
                    Some(at) => at,
                    // Free, or the read failed: the caller re-reads either way.
                    None => return,
                },
            };
            lapse = Some(at);
            let read_at = turn::read_at(head, at, heard, stagger);
            let nap = read_at.saturating_sub(boottime()).min(MAX_NAP);
            let timer = tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + nap));
            tokio::select! {
                _ = &mut granted => {
                    if slot.phase() == Phase::Held {
                        // The holder let go of its byte: released (the caller's acquire reads
                        // it) or dead (the caller then waits here again, at the head).
                        return;
                    }
                }
                _ = async {
                    match &watch {
                        Some(watch) => watch.written().await,
                        None => std::future::pending().await,
                    }
                } => {
                    // A watch serves one wake-up. The head reads at once (with a new watch);
                    // a waiter behind it a stagger later, and only then watches again.
                    watch = None;
                    if head {
                        lapse = None;
                    } else {
                        heard = heard.or(Some(boottime()));
                    }
                }
                _ = timer => {
                    if tokio::time::Instant::now() >= deadline {
                        return;
                    }
                    if boottime() >= read_at {
                        (lapse, heard) = (None, None);
                    }
                }
            }
        }
    }
}

/// When the lease on `lock` lapses (boot clock), or `None` if it is free or cannot be read.
async fn lapses_at(store: &dyn Store, lock: &str) -> Option<Duration> {
    match store.status(lock).await {
        Ok(record) if record.is_held() => Some(boottime() + record.expires_in.unwrap_or_default()),
        _ => None,
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        for slot in self.slots.get_mut().unwrap_or_else(|p| p.into_inner()).values() {
            let mut state = state_of(&slot.shared.state);
            state.closing = true;
            if state.phase == Phase::Held {
                sidecar::unlock(&slot.file, slot.offset);
                state.phase = Phase::Idle;
            }
            slot.shared.changed.notify_all();
        }
    }
}

impl Slot {
    fn phase(&self) -> Phase {
        state_of(&self.shared.state).phase
    }

    /// Make sure this client is queued for the byte or holds it; returns where it stands.
    fn queue(self: &Arc<Self>) -> Phase {
        let mut state = state_of(&self.shared.state);
        if state.phase == Phase::Idle {
            state.thread += 1;
            let (me, thread) = (self.clone(), state.thread);
            // A plain thread, not tokio's blocking pool: nothing waits for it at exit, and a
            // process that ends while it is queued simply leaves the queue.
            let spawned = std::thread::Builder::new()
                .name("leaderrun-wake".into())
                .stack_size(64 * 1024)
                .spawn(move || me.wait_in_queue(thread));
            state.phase = match spawned {
                Ok(_) => Phase::Queued,
                Err(err) => {
                    tracing::debug!("cannot start the wake-up thread, waits will poll: {err}");
                    Phase::Broken
                }
            };
        }
        state.phase
    }

    /// The queue thread: block in the kernel until the byte is ours, then keep it while
    /// this client wants it (a wait, or the lease), and let it go when nobody does.
    fn wait_in_queue(&self, thread: u64) {
        let queued = sidecar::lock_wait(&self.file, self.offset);
        let shared = &self.shared;
        let mut state = state_of(&shared.state);
        if let Err(err) = queued {
            tracing::debug!("cannot queue on the wake-up file, waits will poll: {err}");
            state.phase = Phase::Broken;
            shared.granted.notify_waiters();
            return;
        }
        if state.thread != thread || state.phase != Phase::Queued {
            // Not ours to keep (cannot happen while queued; defensive).
            sidecar::unlock(&self.file, self.offset);
            return;
        }
        state.phase = Phase::Held;
        shared.granted.notify_waiters();
        loop {
            if state.thread != thread || state.phase != Phase::Held {
                // Released (or taken over by a newer thread) meanwhile.
                return;
            }
            let now = Instant::now();
            if !state.wanted(now) {
                sidecar::unlock(&self.file, self.offset);
                state.phase = Phase::Idle;
                return;
            }
            state = match state.linger_until {
                Some(until) if !state.leased && state.waiting == 0 && !state.closing => {
                    shared.changed.wait_timeout(state, until - now).unwrap_or_else(|p| p.into_inner()).0
                }
                _ => shared.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

/// One wait under way on a slot; when the last one ends, the place lingers (see `LINGER`).
struct Waiting<'a>(&'a Slot);

impl<'a> Waiting<'a> {
    fn begin(slot: &'a Slot) -> Self {
        let mut state = state_of(&slot.shared.state);
        state.waiting += 1;
        state.linger_until = None;
        Self(slot)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = state_of(&self.0.shared.state);
        state.waiting -= 1;
        if state.waiting == 0 {
            state.linger_until = Some(Instant::now() + LINGER);
        }
        self.0.shared.changed.notify_all();
    }
}
