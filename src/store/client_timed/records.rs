//! The record interface a client-timed store implements: plain reads and
//! compare-and-set writes on one record per lock, with no notion of time.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::store::{Observing, Result};

/// What a client-timed store keeps per lock: client-go's leader election record
/// (`holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime`,
/// `leaseTransitions`) plus leaderrun's own fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The holder's identity; empty when released (client-go's ReleaseOnCancel writes "").
    pub holder: String,
    /// How long the holder's lease lasts after its last write, in whole seconds (client-go's
    /// `leaseDurationSeconds`). A standby times it from when it saw the write, never from
    /// the times written below.
    pub ttl_seconds: u32,
    /// When the holder acquired it, on the writer's wall clock: display only.
    pub acquired: Option<SystemTime>,
    /// When the holder last renewed it, on the writer's wall clock: display only.
    pub renewed: Option<SystemTime>,
    /// How many times the holder changed (client-go's `leaseTransitions`).
    pub transitions: u32,
    /// leaderrun's fencing token; `None` on a record only another client (client-go) wrote.
    pub token: Option<u64>,
    /// `leaderrun release` asked the holder to stand down.
    pub revoked: bool,
    /// Released with a --min-hold keep: taken until the store server's clock reads this.
    pub kept_until: Option<SystemTime>,
}

impl Record {
    pub fn is_released(&self) -> bool {
        self.holder.is_empty()
    }
}

/// A record's version, opaque to the core: equal versions mean an unchanged record.
/// A store puts in it whatever its writes must carry (a resourceVersion and a uid, an
/// object generation, an ETag).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

/// A record as read, with its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub record: Record,
    pub version: Version,
}

/// One read of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The record, or `None` if there is none (never written, or deleted).
    pub found: Option<Found>,
    /// The store server's clock when it answered (an HTTP `Date` header), if it tells.
    pub server_time: Option<SystemTime>,
    /// A number at least as large as every fencing token any acquisition wrote before
    /// this read, the record's deletion notwithstanding (Kubernetes: the resourceVersion,
    /// an etcd revision that only grows); 0 when the store has no such number.
    pub floor: u64,
}

/// What a guarded replace did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Written; the record's new version.
    Done(Version),
    /// Not written: the record is at another version, or gone. A lost race, never an error.
    Moved,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// Written; the record's version, and a number at least as large as every fencing token
    /// a lease was granted with before this create landed (0 when the store cannot tell). A create can land long after the read its token came
    /// from (a slow network, a paused host, a client's retry), after a record made and
    /// deleted meanwhile: the core counts it only with a token above this.
    Done { version: Version, floor: u64 },
    /// Not written (the lock has a record), or changed or gone before it could count. A lost
    /// race, never an error: the caller re-reads.
    Moved,
}

/// A feed of one lock's record as it changes: one `Read` per change (`found: None` once
/// the record is deleted), in order. It closes when the store ends the watch (a server
/// timeout, a dropped connection, a version too old to watch from).
pub type Feed = tokio::sync::mpsc::Receiver<Read>;

/// Record I/O for one client-timed store. Every method is one request (or as few as the
/// store allows); none knows about time, leases or tokens.
#[async_trait]
pub trait Records: Send + Sync {
    /// The lock's record, if any.
    async fn read(&self, lock: &str) -> Result<Read>;
    /// Write the record if the lock has none.
    async fn create(&self, lock: &str, record: &Record) -> Result<Created>;
    /// Write the record if the lock's record is still at `version`.
    async fn replace(&self, lock: &str, record: &Record, version: &Version) -> Result<Written>;
    /// Every lock with a record, by its (decoded) lock name.
    async fn list(&self) -> Result<Vec<(String, Record)>>;
    /// Return when the lock's record may have moved from `version` (a write or a
    /// deletion), or after `max_wait`. A spurious return is harmless: the caller re-reads.
    /// By default, reads every `poll_every` (`until_moved`), or sleeps if the store gives none.
    async fn changed(&self, lock: &str, version: Option<&Version>, max_wait: Duration) {
        match self.poll_every() {
            Some(every) => until_moved(self, every, lock, version, max_wait).await,
            None => tokio::time::sleep(max_wait).await,
        }
    }
    /// A feed of the lock's changes after `version`, if this store can watch. With one, an
    /// idle standby learns every change without asking: the core answers its re-checks
    /// from the feed and makes no request until the record is free or lapsed. `Ok(None)`:
    /// the store cannot watch, and the core waits with `changed` and reads.
    async fn watch(&self, _lock: &str, _version: &Version) -> Result<Option<Feed>> {
        Ok(None)
    }
    /// How far behind the true time the store server's clock (`Read::server_time`) may read
    /// by its resolution: an HTTP `Date` counts whole seconds, so up to a second. A
    /// `--min-hold` keep written from it is lengthened by this, so that it never ends early.
    fn server_clock_resolution(&self) -> Duration {
        Duration::ZERO
    }
    /// For a store that cannot watch: how often the core may read the record to feed its
    /// changes as a watch would (one read a poll, and nothing more while the holder lives:
    /// the core judges the latest read instead of reading again after each change). `None`:
    /// the core waits with `changed` and reads.
    fn poll_every(&self) -> Option<Duration> {
        None
    }
    /// Whether a lease granted with `token` may count as of `read` (the read its write was
    /// based on, or one made since): only once every create that lands from then on is told
    /// a floor of at least `token` (`Created::Done`), so that no later acquisition can repeat
    /// or undercut it, whichever write carried it and whatever happened to the record since.
    /// Until then the core reads again until it does. By default at once: a floor that every
    /// write advances (a resourceVersion, an entity version) is already past it.
    fn counts(&self, _token: u64, _read: &Read) -> bool {
        true
    }
    /// `Store::observing`, for `leaderrun watch`: the store's own, as the core adds nothing.
    fn observing(&self) -> Observing {
        Observing::Polls
    }
    /// `Store::observe_change`: return when the record may have changed since the last
    /// read, or after `max_wait`; read-only. By default, sleeps.
    async fn observe_change(&self, _lock: &str, max_wait: Duration) {
        tokio::time::sleep(max_wait).await
    }
}

/// A poll's pause: `every` to 1.5 × `every`, so that many waiters spread out, and never more
/// than one request per `every`.
pub fn pause(every: Duration) -> Duration {
    every.mul_f64(rand::random_range(1.0..1.5))
}

/// `Records::changed` by polling: return once a read shows a version other than `version`
/// (with none, other than the first read's, made at once), or after `max_wait`.
pub async fn until_moved<R: Records + ?Sized>(
    records: &R,
    every: Duration,
    lock: &str,
    version: Option<&Version>,
    max_wait: Duration,
) {
    let deadline = tokio::time::Instant::now() + max_wait;
    let mut seen: Option<Option<Version>> = version.map(|v| Some(v.clone()));
    loop {
        if seen.is_some() {
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause(every))).await;
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        let Ok(read) = records.read(lock).await else {
            // An outage: wait a poll before asking again, even before the first answer.
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause(every))).await;
            continue;
        };
        let now = read.found.map(|f| f.version);
        match &seen {
            Some(before) if *before != now => return,
            Some(_) => {}
            None => seen = Some(now),
        }
    }
}
