//! `Store` over `Records`: the timing rules of `mod.rs`, written once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::records::{Created, Found, Read, Record, Records, Version, Written};
use super::sightings::{Sightings, Verdict};
use super::watchers::Watchers;
use crate::clock::{BootClock, Clock};
use crate::store::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

/// Guarded writes retried this often when the record moves under them before giving up.
const MAX_RACES: usize = 20;
/// How often a lease whose token does not count yet (`Records::counts`) reads the record
/// again, and how many times at most (a server clock that does not move).
const SETTLE_POLL: Duration = Duration::from_millis(250);
const MAX_SETTLE_POLLS: usize = 20;

/// The host's wall clock, injectable: written into records for display, and used for a
/// --min-hold keep only where the store reports no clock of its own.
pub type Wall = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// A lease this client holds, with the version its last write left.
struct Held {
    token: u64,
    identity: String,
    record: Record,
    version: Version,
    /// When the acquiring read was answered, on the elapsed-time clock (for --min-hold).
    acquired_at: Duration,
}

pub struct ClientTimed {
    records: Arc<dyn Records>,
    clock: Arc<dyn Clock>,
    wall: Wall,
    seen: Sightings,
    /// The last read of each lock held by another, from which a feed opens.
    last_read: Mutex<HashMap<String, Read>>,
    watchers: Watchers,
    held: Mutex<HashMap<String, Held>>,
}

/// Whole seconds, rounded up: a standby must never wait less than the holder's lease.
fn whole_seconds(ttl: Duration) -> u32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

impl ClientTimed {
    pub fn new(records: Arc<dyn Records>) -> Self {
        Self::with_clocks(records, Arc::new(BootClock), Arc::new(SystemTime::now))
    }

    pub fn with_clocks(records: Arc<dyn Records>, clock: Arc<dyn Clock>, wall: Wall) -> Self {
        Self {
            records,
            clock,
            wall,
            seen: Sightings::default(),
            last_read: Mutex::default(),
            watchers: Watchers::default(),
            held: Mutex::default(),
        }
    }

    /// The store server's clock at `read`, or this host's wall clock if it reports none.
    fn server_now(&self, read: &Read) -> SystemTime {
        read.server_time.unwrap_or_else(|| (self.wall)())
    }

    /// How far `server_now(read)` may be behind the true time by the clock's resolution: a
    /// keep counted from it must add this, or it could end up to that much early.
    fn coarseness(&self, read: &Read) -> Duration {
        if read.server_time.is_some() {
            self.records.server_clock_resolution()
        } else {
            Duration::ZERO // this host's wall clock, which counts finer than a keep
        }
    }

    /// Whether a --min-hold keep on `record` is over at `read`'s server time.
    fn keep_over(&self, record: &Record, read: &Read) -> bool {
        record.kept_until.is_some_and(|until| self.server_now(read) >= until)
    }

    /// The lock record leaderrun shows for `record` (`None`: no record at all).
    fn describe(&self, lock: &str, found: Option<&Record>, now: SystemTime) -> LockRecord {
        let Some(record) = found else { return LockRecord::free(lock) };
        let token = record.token.unwrap_or(0);
        if record.is_released() {
            return LockRecord { token, ..LockRecord::free(lock) };
        }
        // Display only: the holder's wall clock against the server's (or this host's).
        let ends = match record.kept_until {
            Some(until) => Some(until),
            None => record.renewed.map(|at| at + Duration::from_secs(u64::from(record.ttl_seconds))),
        };
        LockRecord {
            lock: lock.to_string(),
            holder: Some(record.holder.clone()),
            token,
            held_since: record.acquired,
            expires_in: Some(ends.and_then(|end| end.duration_since(now).ok()).unwrap_or_default()),
            revoked: record.revoked,
            campaigner: None,
            // Only a release with a keep notes one, and a renewal never follows it.
            kept: record.kept_until.is_some(),
        }
    }

    /// Whether a feed's record may stand in for a read: any record whose judgement needs
    /// no server clock (held, or released — then it is taken straight away with a write
    /// guarded by the version the feed brought). A kept record is judged on the server's
    /// clock and a missing one needs the floor, so those are read afresh.
    fn judged_from_feed(read: &Read) -> bool {
        read.found.as_ref().is_some_and(|f| f.record.kept_until.is_none())
    }

    /// The record this client writes to take `lock` over `previous` (if any).
    fn taken(&self, identity: &str, ttl: Duration, previous: Option<&Record>, floor: u64) -> Record {
        let now = (self.wall)();
        let last = previous.and_then(|r| r.token).unwrap_or(0);
        let transitions = match previous {
            Some(p) if p.holder == identity => p.transitions,
            Some(p) => p.transitions.saturating_add(1),
            None => 0,
        };
        Record {
            holder: identity.to_string(),
            ttl_seconds: whole_seconds(ttl),
            acquired: Some(now),
            renewed: Some(now),
            transitions,
            token: Some(last.max(floor) + 1),
            revoked: false,
            kept_until: None,
        }
    }

    /// `record` given up: no holder, as client-go's ReleaseOnCancel writes it, token kept.
    fn released(&self, record: &Record) -> Record {
        let now = (self.wall)();
        Record {
            holder: String::new(),
            ttl_seconds: 1,
            acquired: Some(now),
            renewed: Some(now),
            revoked: false,
            kept_until: None,
            ..record.clone()
        }
    }

    /// `record` (written with a token) is this client's now, at `version`: the lease it won.
    fn won(&self, lock: &str, identity: &str, record: Record, version: Version, acquired_at: Duration) -> Acquire {
        let token = record.token.expect("written with a token");
        self.remember(lock, Held { token, identity: identity.into(), record, version, acquired_at });
        Acquire::Won(Lease { lock: lock.into(), identity: identity.into(), token })
    }

    fn remember(&self, lock: &str, held: Held) {
        self.seen.forget(lock);
        self.watchers.close(lock);
        self.last_read.lock().unwrap().remove(lock);
        self.held.lock().unwrap().insert(lock.to_string(), held);
    }

    /// The version this client's last write of `lease` left, if it wrote one.
    fn own_write(&self, lease: &Lease) -> Option<(Record, Version)> {
        let held = self.held.lock().unwrap();
        let h = held.get(&lease.lock).filter(|h| h.token == lease.token && h.identity == lease.identity)?;
        Some((h.record.clone(), h.version.clone()))
    }

    /// Whether `record` is still `lease`'s and may be renewed.
    fn is_live(record: &Record, lease: &Lease) -> bool {
        record.token == Some(lease.token)
            && record.holder == lease.identity
            && !record.revoked
            && record.kept_until.is_none()
    }

    /// A created `record` at `version`, with a token above every earlier one: as written if
    /// it already is (above `floor`, every token written before the create landed), else
    /// rewritten with `floor + 1` in one write guarded by the create's version, before any
    /// child can start under it. Without that, a create that landed late, after another
    /// run's record was made and deleted meanwhile, would repeat or undercut that run's
    /// token. `None`: the record moved first; the caller re-reads.
    async fn above(
        &self,
        lock: &str,
        record: Record,
        version: Version,
        floor: u64,
    ) -> Result<Option<(Record, Version)>> {
        if record.token.is_some_and(|token| token > floor) {
            return Ok(Some((record, version)));
        }
        let raised = Record { token: Some(floor + 1), ..record };
        tracing::debug!(
            lock,
            token = floor + 1,
            "the create landed after writes its read did not see; raising its token"
        );
        Ok(self.replace(lock, &raised, &version).await?.map(|version| (raised, version)))
    }

    /// Whether `record`, just written at `version` by a write based on `read`, may count: at
    /// once if the store says its token does as of that read, else once a later read says so
    /// (`Records::counts`). False if the record moved meanwhile (the caller re-reads).
    async fn settled(&self, lock: &str, record: &Record, version: &Version, read: &Read) -> Result<bool> {
        let token = record.token.expect("written with a token");
        if self.records.counts(token, read) {
            return Ok(true);
        }
        for _ in 0..MAX_SETTLE_POLLS {
            tokio::time::sleep(SETTLE_POLL).await;
            let now = self.records.read(lock).await?;
            if now.found.as_ref().map(|f| &f.version) != Some(version) {
                return Ok(false);
            }
            if self.records.counts(token, &now) {
                return Ok(true);
            }
        }
        Err(StoreError::unavailable(format!(
            "acquiring {lock:?}: the store server's clock did not pass the token's second within {:?}",
            SETTLE_POLL * MAX_SETTLE_POLLS as u32
        )))
    }

    /// Write `record` over `version`; on `Moved`, the caller re-reads.
    async fn replace(&self, lock: &str, record: &Record, version: &Version) -> Result<Option<Version>> {
        Ok(match self.records.replace(lock, record, version).await? {
            Written::Done(version) => Some(version),
            Written::Moved => None,
        })
    }

    fn raced(what: &str, lock: &str) -> StoreError {
        StoreError::unavailable(format!("{what} {lock:?}: the record kept changing under {MAX_RACES} attempts"))
    }
}

#[async_trait]
impl Store for ClientTimed {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        // A lost race is followed by a read of the store itself, whatever the feed says.
        let mut raced = false;
        for _ in 0..MAX_RACES {
            let (read, seen_at) = match self.watchers.get(lock).and_then(|w| w.latest()) {
                Some((read, at)) if !raced && Self::judged_from_feed(&read) => (read, at),
                _ => {
                    let read = self.records.read(lock).await?;
                    self.last_read.lock().unwrap().insert(lock.to_string(), read.clone());
                    (read, self.clock.now())
                }
            };
            raced = true;
            let answered = self.clock.now();
            let Some(Found { record, version }) = &read.found else {
                let mine = self.taken(identity, ttl, None, read.floor);
                let Created::Done { version, floor } = self.records.create(lock, &mine).await? else {
                    continue; // created by another meanwhile: read it
                };
                let Some((mine, version)) = self.above(lock, mine, version, floor).await? else {
                    continue; // it moved before its token was made good: read it
                };
                if self.settled(lock, &mine, &version, &read).await? {
                    return Ok(self.won(lock, identity, mine, version, answered));
                }
                continue; // deleted, or taken over, before it counted
            };
            let free = record.is_released() || self.keep_over(record, &read);
            if !free {
                let shown = self.describe(lock, Some(record), self.server_now(&read));
                if record.kept_until.is_some() {
                    // A keep not over yet: this firing has run; the next one takes it.
                    self.seen.judge(lock, version, record.ttl_seconds, seen_at, answered);
                    return Ok(Acquire::Held(shown));
                }
                match self.seen.judge(lock, version, record.ttl_seconds, seen_at, answered) {
                    Verdict::Lapsed => {}
                    Verdict::Watching { alive: true, .. } => return Ok(Acquire::Held(shown)),
                    Verdict::Watching { left, alive: false } => {
                        return Ok(Acquire::Unproven { record: shown, decide_in: left })
                    }
                }
                tracing::debug!(lock, holder = %record.holder, "the record did not change for a whole lease; taking it");
            }
            let mine = self.taken(identity, ttl, Some(record), read.floor);
            if let Some(version) = self.replace(lock, &mine, version).await? {
                if self.settled(lock, &mine, &version, &read).await? {
                    return Ok(self.won(lock, identity, mine, version, answered));
                }
            }
        }
        Err(Self::raced("acquiring", lock))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let lock = &lease.lock;
        // One request while nobody else wrote: the version this client's last write left.
        if let Some((record, version)) = self.own_write(lease) {
            let renewed = Record { renewed: Some((self.wall)()), ttl_seconds: whole_seconds(ttl), ..record };
            if let Some(version) = self.replace(lock, &renewed, &version).await? {
                if let Some(h) = self.held.lock().unwrap().get_mut(lock.as_str()) {
                    (h.record, h.version) = (renewed, version);
                }
                return Ok(Renew::Renewed);
            }
        }
        for _ in 0..MAX_RACES {
            let read = self.records.read(lock).await?;
            let Some(Found { record, version }) = read.found.clone() else { return Ok(Renew::Lost(None)) };
            if !Self::is_live(&record, lease) {
                return Ok(Renew::Lost(Some(self.describe(lock, Some(&record), self.server_now(&read)))));
            }
            let renewed = Record { renewed: Some((self.wall)()), ttl_seconds: whole_seconds(ttl), ..record };
            if let Some(version) = self.replace(lock, &renewed, &version).await? {
                let acquired_at =
                    self.held.lock().unwrap().get(lock.as_str()).map_or(self.clock.now(), |h| h.acquired_at);
                let held = Held {
                    token: lease.token,
                    identity: lease.identity.clone(),
                    record: renewed,
                    version,
                    acquired_at,
                };
                self.held.lock().unwrap().insert(lock.clone(), held);
                return Ok(Renew::Renewed);
            }
        }
        Err(Self::raced("renewing", lock))
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let lock = &lease.lock;
        let acquired_at =
            self.held.lock().unwrap().get(lock.as_str()).filter(|h| h.token == lease.token).map(|h| h.acquired_at);
        // Nothing left to keep, and nobody else wrote since this client did: one guarded write.
        let keep_over = acquired_at.is_some_and(|at| self.clock.now().saturating_sub(at) >= keep);
        if let Some((record, version)) = self.own_write(lease).filter(|_| keep_over) {
            if self.replace(lock, &self.released(&record), &version).await?.is_some() {
                self.held.lock().unwrap().remove(lock.as_str());
                return Ok(());
            }
        }
        for _ in 0..MAX_RACES {
            let read = self.records.read(lock).await?;
            let Some(Found { record, version }) = &read.found else { break };
            if record.token != Some(lease.token) || record.holder != lease.identity {
                break; // not this lease's any more: leave it alone
            }
            // The keep counts from the acquisition: on this client's elapsed-time clock if it
            // acquired, else from the record's acquire time on the wall clocks.
            let held_for = match acquired_at {
                Some(at) => self.clock.now().saturating_sub(at),
                None => record.acquired.and_then(|at| self.server_now(&read).duration_since(at).ok()).unwrap_or(keep),
            };
            let left = keep.saturating_sub(held_for);
            let next = if left.is_zero() || record.revoked {
                self.released(record)
            } else {
                Record {
                    ttl_seconds: whole_seconds(left),
                    renewed: Some((self.wall)()),
                    kept_until: Some(self.server_now(&read) + left + self.coarseness(&read)),
                    ..record.clone()
                }
            };
            if self.replace(lock, &next, version).await?.is_some() {
                break;
            }
        }
        self.held.lock().unwrap().remove(lock.as_str());
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let read = self.records.read(lock).await?;
        Ok(self.describe(lock, read.found.as_ref().map(|f| &f.record), self.server_now(&read)))
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let now = (self.wall)();
        Ok(self.records.list().await?.iter().map(|(lock, record)| self.describe(lock, Some(record), now)).collect())
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        for _ in 0..MAX_RACES {
            let read = self.records.read(lock).await?;
            let Some(Found { record, version }) = &read.found else { return Ok(None) };
            if record.is_released() {
                return Ok(None);
            }
            let before = self.describe(lock, Some(record), self.server_now(&read));
            let next = if record.kept_until.is_some() {
                self.released(record) // no child runs under a keep: free it now
            } else if record.revoked {
                return Ok(Some(before));
            } else {
                Record { revoked: true, ..record.clone() }
            };
            if self.replace(lock, &next, version).await?.is_some() {
                return Ok(Some(before));
            }
        }
        Err(Self::raced("revoking", lock))
    }

    fn sees_expiry(&self) -> bool {
        // `changed` returns when the version last seen would count as lapsed.
        true
    }

    fn observing(&self) -> crate::store::Observing {
        self.records.observing()
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        self.records.observe_change(lock, max_wait).await
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        // Wake when the record changes, or when the version last seen would count as lapsed.
        let Some((version, left)) = self.seen.last(lock, self.clock.now()) else {
            return self.records.changed(lock, None, max_wait).await;
        };
        let bound = max_wait.min(left.max(Duration::from_millis(1)));
        let watched = match self.watchers.get(lock) {
            Some(live) => Some(live),
            None => {
                let read = self.last_read.lock().unwrap().get(lock).cloned();
                let from_seen = read.filter(|r| r.found.as_ref().is_some_and(|f| f.version == version));
                match from_seen {
                    Some(read) => self.watchers.open(&self.records, &self.clock, lock, read).await,
                    None => None,
                }
            }
        };
        match watched {
            Some(watched) => watched.moved_from(&version, bound).await,
            None => self.records.changed(lock, Some(&version), bound).await,
        }
    }
}
