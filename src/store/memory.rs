//! An in-memory store for the elector's unit tests, on an injected clock.
//!
//! It keeps the same rules as the real stores (compare-and-set on the token,
//! expiry on the store's clock, a token that only grows) and can be told to
//! misbehave: fail, hang, answer late, or hand the lease to someone else.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};
use crate::clock::Clock;

#[derive(Debug, Clone)]
struct Row {
    holder: Option<String>,
    token: u64,
    acquired: Duration,
    expires: Duration,
    revoked: bool,
    /// Released with a keep (--min-hold): no child runs under it.
    kept: bool,
}

/// How the store answers renewals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Normal,
    /// Answer with an error that may pass on retry (a server down, a leader being elected).
    Fail,
    /// Answer with an error that will not pass on retry (bad credentials, no permission).
    Refuse,
    /// Never answer.
    Hang,
    /// Do the work at once but answer this much later.
    Late(Duration),
    /// Do the work, then answer with an error (a reply lost to a reset, or a client-side
    /// timeout that fired after the request went out).
    DoneThenFail,
    /// Never answer, and do the work this much later, whether or not the caller still waits
    /// (a request queued on the server, or on another connection, that lands late).
    LandsAfter(Duration),
}

pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    rows: Mutex<BTreeMap<String, Row>>,
    renew_behaviour: Mutex<Behaviour>,
    acquire_behaviour: Mutex<Behaviour>,
    /// Answer a won acquire with `Acquire::Confirm` and this cool-down (as in a Choria bucket).
    confirm_after: Mutex<Option<Duration>>,
    notify: Notify,
    /// Every call, for assertions: (clock reading, operation).
    pub calls: Mutex<Vec<(Duration, String)>>,
    /// The lease asked for by every acquire and renew: (clock reading, operation, ttl).
    pub ttls: Mutex<Vec<(Duration, &'static str, Duration)>>,
    /// How acquires of one lock answer, where it differs from `acquire_behaviour`.
    acquire_for: Mutex<BTreeMap<String, Behaviour>>,
    /// How `status` reads answer (and so a give-back, which reads before it releases).
    status_behaviour: Mutex<Behaviour>,
    /// Acquires still on their way (`Behaviour::LandsAfter`): when each lands, the lock, the
    /// identity and the ttl. Any later look at the store lands those due first.
    landing: Mutex<Vec<(Duration, String, String, Duration)>>,
    /// What `longest_ttl` and `longest_keep` answer (a store that keeps leases, or locks
    /// after their child exits, for a limited time only: a NATS bucket's max age).
    limits: Mutex<(Option<Duration>, Option<Duration>)>,
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            rows: Mutex::new(BTreeMap::new()),
            renew_behaviour: Mutex::new(Behaviour::Normal),
            acquire_behaviour: Mutex::new(Behaviour::Normal),
            confirm_after: Mutex::new(None),
            notify: Notify::new(),
            calls: Mutex::new(Vec::new()),
            ttls: Mutex::new(Vec::new()),
            limits: Mutex::new((None, None)),
            acquire_for: Mutex::new(BTreeMap::new()),
            status_behaviour: Mutex::new(Behaviour::Normal),
            landing: Mutex::new(Vec::new()),
        }
    }

    /// Make acquires of `lock` alone behave as `behaviour`.
    pub fn set_acquire_for(&self, lock: &str, behaviour: Behaviour) {
        self.acquire_for.lock().unwrap().insert(lock.to_string(), behaviour);
    }

    pub fn set_status(&self, behaviour: Behaviour) {
        *self.status_behaviour.lock().unwrap() = behaviour;
    }

    /// Keep leases for at most `ttl`, and a lock after its child exits for at most `keep`.
    pub fn set_limits(&self, ttl: Option<Duration>, keep: Option<Duration>) {
        *self.limits.lock().unwrap() = (ttl, keep);
    }

    pub fn set_renew(&self, behaviour: Behaviour) {
        *self.renew_behaviour.lock().unwrap() = behaviour;
    }

    pub fn set_acquire(&self, behaviour: Behaviour) {
        *self.acquire_behaviour.lock().unwrap() = behaviour;
    }

    /// Make every won acquire from now on need confirming after `after` (None: won at once).
    pub fn set_confirm(&self, after: Option<Duration>) {
        *self.confirm_after.lock().unwrap() = after;
    }

    /// Hand the lock to `holder` behind the current holder's back (as after an expiry).
    pub fn steal(&self, lock: &str, holder: &str, ttl: Duration) {
        let now = self.clock.now();
        let mut rows = self.rows.lock().unwrap();
        let row = rows.entry(lock.to_string()).or_insert(Row {
            holder: None,
            token: 0,
            acquired: now,
            expires: now,
            revoked: false,
            kept: false,
        });
        *row = Row {
            holder: Some(holder.to_string()),
            token: row.token + 1,
            acquired: now,
            expires: now + ttl,
            revoked: false,
            kept: false,
        };
    }

    /// Free the lock as its holder would on a clean exit, and wake the waiters.
    pub fn free(&self, lock: &str) {
        if let Some(row) = self.rows.lock().unwrap().get_mut(lock) {
            row.holder = None;
            row.expires = Duration::ZERO;
        }
        self.notify.notify_waiters();
    }

    /// Apply the acquires of `Behaviour::LandsAfter` whose time has come.
    fn land(&self) {
        let now = self.clock.now();
        let due: Vec<_> = {
            let mut landing = self.landing.lock().unwrap();
            let (due, later) = landing.drain(..).partition(|(at, ..)| *at <= now);
            *landing = later;
            due
        };
        for (_, lock, identity, ttl) in due {
            self.take(&lock, &identity, ttl);
        }
    }

    /// The acquire's write: the lease if the lock is free, else who holds it.
    fn take(&self, lock: &str, identity: &str, ttl: Duration) -> Acquire {
        let now = self.clock.now();
        let mut rows = self.rows.lock().unwrap();
        let current = rows.get(lock).cloned();
        let free = current.as_ref().is_none_or(|r| r.holder.is_none() || r.expires <= now);
        if !free {
            return Acquire::Held(self.record(lock, current.as_ref()));
        }
        let token = current.map_or(1, |r| r.token + 1);
        let row = Row {
            holder: Some(identity.to_string()),
            token,
            acquired: now,
            expires: now + ttl,
            revoked: false,
            kept: false,
        };
        rows.insert(lock.to_string(), row);
        let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token };
        match *self.confirm_after.lock().unwrap() {
            Some(after) => Acquire::Confirm { lease, after },
            None => Acquire::Won(lease),
        }
    }

    /// When the store would expire the lock's lease (None if free).
    pub fn expiry(&self, lock: &str) -> Option<Duration> {
        self.land();
        let rows = self.rows.lock().unwrap();
        rows.get(lock).filter(|r| r.holder.is_some()).map(|r| r.expires)
    }

    fn log(&self, what: String) {
        self.calls.lock().unwrap().push((self.clock.now(), what));
    }

    async fn behave(&self, behaviour: Behaviour) -> Result<()> {
        match behaviour {
            Behaviour::Normal => Ok(()),
            Behaviour::Fail => Err(StoreError::unavailable("injected failure")),
            Behaviour::Refuse => Err(StoreError::refused("injected refusal")),
            Behaviour::Hang | Behaviour::LandsAfter(_) => std::future::pending().await,
            Behaviour::Late(_) | Behaviour::DoneThenFail => Ok(()),
        }
    }

    fn record(&self, lock: &str, row: Option<&Row>) -> LockRecord {
        let now = self.clock.now();
        match row {
            Some(r) if r.holder.is_some() && r.expires > now => LockRecord {
                lock: lock.to_string(),
                holder: r.holder.clone(),
                token: r.token,
                held_since: None,
                expires_in: Some(r.expires - now),
                revoked: r.revoked,
                campaigner: None,
                kept: r.kept,
            },
            Some(r) => LockRecord { token: r.token, ..LockRecord::free(lock) },
            None => LockRecord::free(lock),
        }
    }
}

/// The answer to work already done: late, lost to an error, or as it is.
async fn answer<T>(behaviour: Behaviour, result: T) -> Result<T> {
    match behaviour {
        Behaviour::Late(delay) => tokio::time::sleep(delay).await,
        Behaviour::DoneThenFail => return Err(StoreError::unavailable("injected failure after the work was done")),
        _ => {}
    }
    Ok(result)
}

#[async_trait]
impl Store for MemoryStore {
    async fn longest_ttl(&self, _wanted: Duration) -> Result<Option<Duration>> {
        Ok(self.limits.lock().unwrap().0)
    }

    async fn longest_keep(&self) -> Result<Option<Duration>> {
        Ok(self.limits.lock().unwrap().1)
    }

    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        self.log(format!("acquire {identity}"));
        self.ttls.lock().unwrap().push((self.clock.now(), "acquire", ttl));
        self.land();
        let behaviour =
            self.acquire_for.lock().unwrap().get(lock).copied().unwrap_or(*self.acquire_behaviour.lock().unwrap());
        if let Behaviour::LandsAfter(after) = behaviour {
            let at = self.clock.now() + after;
            self.landing.lock().unwrap().push((at, lock.to_string(), identity.to_string(), ttl));
        }
        self.behave(behaviour).await?;
        let result = self.take(lock, identity, ttl);
        answer(behaviour, result).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        self.land();
        self.log(format!("renew {}", lease.token));
        self.ttls.lock().unwrap().push((self.clock.now(), "renew", ttl));
        let behaviour = *self.renew_behaviour.lock().unwrap();
        self.behave(behaviour).await?;
        let now = self.clock.now();
        let result = {
            let mut rows = self.rows.lock().unwrap();
            match rows.get_mut(&lease.lock) {
                Some(row)
                    if row.token == lease.token && row.holder.as_deref() == Some(&lease.identity) && !row.revoked =>
                {
                    row.expires = now + ttl;
                    Renew::Renewed
                }
                other => {
                    let row = other.map(|r| r.clone());
                    Renew::Lost(Some(self.record(&lease.lock, row.as_ref())))
                }
            }
        };
        answer(behaviour, result).await
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        self.land();
        self.log(format!("release {} keep {keep:?}", lease.token));
        let now = self.clock.now();
        let mut rows = self.rows.lock().unwrap();
        if let Some(row) = rows.get_mut(&lease.lock) {
            if row.token == lease.token && row.holder.as_deref() == Some(&lease.identity) {
                if row.acquired + keep > now {
                    row.expires = row.acquired + keep;
                    row.kept = true;
                } else {
                    row.holder = None;
                    row.expires = Duration::ZERO;
                }
            }
        }
        drop(rows);
        self.notify.notify_waiters();
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        self.land();
        let behaviour = *self.status_behaviour.lock().unwrap();
        self.behave(behaviour).await?;
        let record = {
            let rows = self.rows.lock().unwrap();
            self.record(lock, rows.get(lock))
        };
        answer(behaviour, record).await
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        self.land();
        let rows = self.rows.lock().unwrap();
        Ok(rows.iter().map(|(name, row)| self.record(name, Some(row))).collect())
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        self.land();
        let mut rows = self.rows.lock().unwrap();
        let before = self.record(lock, rows.get(lock));
        if let Some(row) = rows.get_mut(lock).filter(|_| before.is_held()) {
            if row.kept {
                row.holder = None;
                row.expires = Duration::ZERO;
            } else {
                row.revoked = true;
            }
        }
        Ok(before.is_held().then_some(before))
    }

    async fn changed(&self, _lock: &str, max_wait: Duration) {
        let _ = tokio::time::timeout(max_wait, self.notify.notified()).await;
    }
}
