//! Where leases live: one small trait, one file per store.
//!
//! A store knows nothing of processes or deadlines. It offers a linearizable
//! compare-and-set on one record per lock name, judges expiry on its own clock,
//! and keeps a fencing token that strictly increases with every acquisition.
//! The elector (`elector.rs`) builds the safety contract on top of these calls.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "azblob")]
pub mod azblob;
pub mod client_timed;
#[cfg(feature = "datastore")]
pub mod datastore;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "gcs")]
pub mod gcs;
#[cfg(feature = "google")]
pub mod google;
pub mod kind;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(test)]
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod registry;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod release_feed;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub mod url;

#[cfg(feature = "zookeeper")]
pub mod zookeeper;

/// Whether the command may create the store (a run) or only look at it
/// (`status`, `list`, `release` never create an empty store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Create,
    Existing,
}

/// A lease this run holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lock: String,
    pub identity: String,
    /// The fencing token: larger than that of every earlier acquisition of this lock.
    pub token: u64,
}

/// What the store says about one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRecord {
    pub lock: String,
    /// The holder's identity; `None` when the lock is free.
    pub holder: Option<String>,
    /// The token of the latest acquisition (0 if never acquired).
    pub token: u64,
    /// Wall-clock time of the latest acquisition, for display only.
    pub held_since: Option<SystemTime>,
    /// Time left before the store expires the lease, on the store's clock; `None` when free.
    pub expires_in: Option<Duration>,
    /// `leaderrun release` asked the holder to stand down; the lock stays taken until the
    /// holder frees it (once its child is stopped) or the lease expires.
    pub revoked: bool,
    /// The holder is another program's campaigner, not a leaderrun run (a Choria leader): its
    /// record keeps only its last renewal, so `held_since` is unknown and `token` changes at
    /// every renewal.
    pub campaigner: Option<Campaigner>,
    /// The lease is only kept for --min-hold: its child has exited and no holder renews it.
    /// The lock stays taken until the keep ends (or `leaderrun release` frees it).
    pub kept: bool,
}

/// What a store knows of a holder that is another program's campaigner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Campaigner {
    /// Wall-clock time of its last renewal (on the store's server), for display only.
    pub renewed_at: SystemTime,
    /// How often it renews: it notices that it lost the lock (a revoke, an evict) only then.
    pub renews_every: Duration,
}

/// The holder an acquire reports while a store that failed over waits out the old epoch's
/// leases (`LockRecord::after_failover`).
pub const FAILOVER_GRACE_HOLDER: &str = "(a lease the store's failover may have lost)";

impl LockRecord {
    /// The answer to an acquire on a replicated store whose primary changed less than a grace
    /// ago (docs/safety.md, "A store's own failover"): a lease the old primary granted may still
    /// have its child running though the new primary has no record of it, so every lock counts
    /// as held until `left` has passed. `token` is the lock's latest token as the new primary
    /// shows it.
    pub fn after_failover(lock: &str, token: u64, left: Duration) -> Self {
        Self { holder: Some(FAILOVER_GRACE_HOLDER.to_string()), token, expires_in: Some(left), ..Self::free(lock) }
    }

    pub fn is_held(&self) -> bool {
        self.holder.is_some()
    }

    /// A record for a lock the store has never seen.
    pub fn free(lock: &str) -> Self {
        Self {
            lock: lock.to_string(),
            holder: None,
            token: 0,
            held_since: None,
            expires_in: None,
            revoked: false,
            campaigner: None,
            kept: false,
        }
    }
}

/// How `leaderrun watch` learns that a lock changed (DESIGN.md §9, Observing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observing {
    /// The store has no read-only push channel: `watch` reads the record once a second.
    Polls,
    /// `observe_change` returns at every write to the lock's record (taken, renewed where a
    /// renewal writes the record, released, revoked, kept) and when the lease expires.
    Pushes,
    /// As `Pushes`, but an expiry is silent (nothing in the store announces it): `watch` also
    /// reads again when the lease it last saw would expire.
    PushesWrites,
}

/// Outcome of an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    Won(Lease),
    /// The write won, but the lease may not be used yet: it is trusted only once a renewal
    /// sent `after` from now succeeds (Choria's cool-down). A renewal that finds the lease
    /// lost means the campaign was lost.
    Confirm {
        lease: Lease,
        after: Duration,
    },
    /// Someone else holds it (this record says who).
    Held(LockRecord),
    /// A client-timed store's first sight of a held record: whether its holder still
    /// renews is not known yet. If the record stays unchanged for `decide_in` more, the
    /// next acquire takes it; if it changes first, its holder is alive (`Held`).
    Unproven {
        record: LockRecord,
        decide_in: Duration,
    },
}

/// Outcome of a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renew {
    Renewed,
    /// The record no longer carries our token: released by force, or taken by another
    /// (the record, if the store could say).
    Lost(Option<LockRecord>),
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// May succeed if retried: connection refused, timeout, busy.
    Unavailable,
    /// Will not succeed if retried: bad credentials, no permission, unusable file.
    Refused,
    /// The store's own settings do not fit what the run asked for (a --ttl longer than a
    /// bucket keeps a lease): a configuration error, found before anything was written.
    Unfit,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: ErrorKind,
    pub message: String,
}

impl StoreError {
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Unavailable, message: message.into() }
    }
    pub fn refused(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Refused, message: message.into() }
    }
    pub fn unfit(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Unfit, message: message.into() }
    }
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Unavailable
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The interface every store implements, and the only one the elector uses.
///
/// Each call is one atomic step in the store (a single statement, or one short
/// transaction). Expiry is judged on the store's clock, never on a wall clock.
#[async_trait]
pub trait Store: Send + Sync {
    /// Take the lock for `identity` for `ttl` if it is free, released or expired;
    /// the new lease's token is larger than any earlier one for this lock.
    /// A lock held by anyone, this identity included, is not taken.
    ///
    /// `ttl` is the lease's lifetime in the store, which may be longer than the run's --ttl
    /// (`Timing::store_ttl`: + --lock-delay). A store times everything it keeps for the lease
    /// from it (a record's expiry, a session, a key's TTL, a client-timed record's stated
    /// lease); the holder's own deadline is the elector's business.
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire>;

    /// Extend the lease by `ttl` (its lifetime in the store, as for `acquire`) from now if the
    /// record still carries its token and has not been revoked.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew>;

    /// Give the lease up (a revoked lease too). With `keep` > 0 the record stays taken until `keep` after the
    /// lease was acquired (for --min-hold), or is freed now if that moment has passed.
    /// Does nothing if the record no longer carries the lease's token.
    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()>;

    /// The record of one lock (free if the store has never seen it).
    async fn status(&self, lock: &str) -> Result<LockRecord>;

    /// Every lock the store has a record of.
    async fn list(&self) -> Result<Vec<LockRecord>>;

    /// Ask the holder of a lock to stand down (`leaderrun release`): its renewals fail from
    /// now on, so it stops its child and then frees the lock. A live lease is NOT freed here:
    /// a standby that took it at once would run beside the old child. If the holder never
    /// frees it, the lease lapses at its expiry as usual. A lease only kept for --min-hold
    /// (released with `keep`: its child is gone) IS freed at once, since no child runs under
    /// it and no holder is left to free it. Returns the record as it was before, if it was held.
    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>>;

    /// Free the lock if `identity` holds it. An acquire whose answer never came (it timed out,
    /// or a signal ended the wait) may still have been granted; nobody would hold that lease,
    /// yet it would keep every other host out for a whole ttl. Only this run's own identity
    /// is given, so no one else's lease is touched; a lease taken since by another carries
    /// another token, which `release` leaves alone. A store that keeps more than the record
    /// (a session, a lease id) overrides this to clean that up too.
    async fn abandon(&self, lock: &str, identity: &str) -> Result<()> {
        let record = self.status(lock).await?;
        if record.holder.as_deref() == Some(identity) {
            let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token: record.token };
            self.release(&lease, Duration::ZERO).await?;
        }
        Ok(())
    }

    /// The longest lease (lifetime in the store, as `acquire` is asked for) this store can
    /// keep, if it sets a limit of its own (a ZooKeeper server's maxSessionTimeout, a NATS
    /// bucket's max age). With no --ttl given, a run picks the longest default ttl whose lease
    /// (ttl + --lock-delay) fits under it. `wanted` is the lease the run would ask for as
    /// things stand: a store may answer `wanted` itself once it knows that fits, without
    /// asking further (ZooKeeper then keeps the session it asked with for the lease).
    async fn longest_ttl(&self, _wanted: Duration) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// How long this store may take to serve again after losing one of its servers, if that is
    /// longer than leaderrun's defaults ride out (DESIGN.md §9): a NATS bucket replicated on
    /// several servers, whose stream's leader election takes up to 15 s. Without --ttl a run
    /// then takes a ttl whose renewals ride it out, and a one-shot run without --timeout
    /// retries that long (its default --min-hold twice that).
    async fn failover(&self) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// The longest --min-hold this store can keep a lock for after its child exits, if it sets
    /// a limit of its own (a NATS bucket without per-message TTL keeps a released entry for its
    /// max age, no longer). A shorter default is capped to it; a longer --min-hold is refused.
    async fn longest_keep(&self) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// Return when the lock may have changed (a release or expiry), or after at most
    /// `max_wait`. Stores without change notification poll; either way the caller
    /// re-reads, so a spurious return is harmless.
    async fn changed(&self, lock: &str, max_wait: Duration);

    /// Give up this store's place among `lock`'s standbys, if `changed` keeps one across calls
    /// (an etcd queue entry, a ZooKeeper queue node): a run that stops waiting for the lock
    /// (it won another slot of it) must not leave a place that the standbys behind it wait out.
    /// Places kept for another lock are left alone. Called only for a lock this store does not
    /// hold (a holder's place may go with its lease, as ZooKeeper's does).
    async fn stop_waiting(&self, _lock: &str) {}

    /// Whether `changed` also returns when a lease expires, not only when it is released:
    /// a watch on a record the server itself deletes at expiry (an etcd lease, a ZooKeeper
    /// session), a poll that reads the record, a client-timed store's own observation. A
    /// waiting campaign then re-reads only when `changed` returns. Otherwise it also re-reads
    /// when the lease it last saw would expire.
    fn sees_expiry(&self) -> bool {
        false
    }

    /// How `observe_change` learns of changes: see `Observing`.
    fn observing(&self) -> Observing {
        Observing::Polls
    }

    /// For `leaderrun watch`: return when the lock's record may have changed in any way, or
    /// after at most `max_wait`; the caller reads the record again either way. It only looks:
    /// it writes nothing, holds no lease and takes no turn in a queue of waiters (a wake-up
    /// meant for a standby must never be spent on a watcher), and it makes no request while
    /// nothing changes on a store that `Pushes`. A store that `Polls` just sleeps here.
    async fn observe_change(&self, _lock: &str, max_wait: Duration) {
        tokio::time::sleep(max_wait).await
    }
}

/// `changed` for stores without change notification: re-read the lock every `every` to
/// 1.5 × `every` (jittered, so that many waiters do not read in step, and never more than one
/// read per `every`, as the client-timed stores poll) until it looks free or `max_wait` has
/// passed. A read is cheap; only a lock that looks free is worth an acquire, which is a write.
pub async fn poll_until_free<S: Store + ?Sized>(store: &S, lock: &str, max_wait: Duration, every: Duration) {
    use rand::Rng;
    let started = tokio::time::Instant::now();
    loop {
        let jittered = every.mul_f64(rand::rng().random_range(1.0..1.5));
        tokio::time::sleep(jittered.min(max_wait.saturating_sub(started.elapsed()))).await;
        if started.elapsed() >= max_wait {
            return;
        }
        match store.status(lock).await {
            Ok(record) if record.is_held() => continue,
            _ => return,
        }
    }
}

/// Whether an error's text says a TLS handshake failed for good: a server certificate the
/// client does not trust, or a client certificate the server refused (a fatal alert).
/// rustls' errors reach the stores wrapped in I/O or gRPC errors, known only by their text;
/// retrying them would not help.
pub fn is_tls_refusal(text: &str) -> bool {
    ["invalid peer certificate", "received fatal alert", "peer is incompatible"].iter().any(|t| text.contains(t))
}

/// The contents of a file a store URL names (`cacert=`, `cert=`, `key=`), if it names one;
/// a file that cannot be read is refused in one line (`store` and `shown` say which URL).
pub fn read_url_file(store: &str, shown: &str, param: &str, path: Option<&str>) -> Result<Option<Vec<u8>>> {
    path.map(|path| {
        std::fs::read(path)
            .map_err(|e| StoreError::refused(format!("{store} store {shown}: cannot read {param}={path}: {e}")))
    })
    .transpose()
}

/// `changed` for stores that watch the lock (etcd, NATS, ZooKeeper): `watch` returns once
/// the lock may have changed, or fails; it is given at most `max_wait`. After a failure the
/// wait pauses a little (within `max_wait`): the caller re-reads and may call again at once,
/// and must not spin while the server is down.
pub async fn watch_at_most(watch: impl std::future::Future<Output = Result<()>>, max_wait: Duration) {
    const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(250);
    let deadline = tokio::time::Instant::now() + max_wait;
    if let Ok(Err(_)) = tokio::time::timeout_at(deadline, watch).await {
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + PAUSE_AFTER_FAILURE)).await;
    }
}

/// Longest lock name accepted, in characters.
pub const MAX_LOCK_NAME: usize = 255;

/// Check a lock name: 1-255 characters, no control characters, no leading or trailing
/// white space (almost always a quoting mistake).
pub fn validate_lock_name(name: &str) -> std::result::Result<(), String> {
    let count = name.chars().count();
    if name.trim().is_empty() {
        return Err("--lock must not be empty".into());
    }
    if count > MAX_LOCK_NAME {
        return Err(format!("--lock is {count} characters long; the maximum is {MAX_LOCK_NAME}"));
    }
    if name.chars().any(char::is_control) {
        return Err("--lock must not contain control characters (newline, tab, NUL, ...)".into());
    }
    if name.trim() != name {
        return Err(format!("--lock {name:?} starts or ends with white space"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names() {
        assert!(validate_lock_name("nightly-report").is_ok());
        assert!(validate_lock_name("it's \"quoted\" and ünïcødé with spaces").is_ok());
        assert!(validate_lock_name(&"x".repeat(255)).is_ok());
        assert!(validate_lock_name(&"é".repeat(255)).is_ok());
        assert!(validate_lock_name("").unwrap_err().contains("empty"));
        assert!(validate_lock_name("   ").unwrap_err().contains("empty"));
        assert!(validate_lock_name(&"x".repeat(256)).unwrap_err().contains("256 characters"));
        assert!(validate_lock_name("a\nb").unwrap_err().contains("control"));
        assert!(validate_lock_name("a\0b").unwrap_err().contains("control"));
        assert!(validate_lock_name(" a").unwrap_err().contains("white space"));
    }
}
