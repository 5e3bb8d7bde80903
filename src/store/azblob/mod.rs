//! Azure Blob store: `--store azblob://ACCOUNT/CONTAINER[/PREFIX]`, one blob per lock
//! (`record.rs`), leased with the blob's own lease, which the server ends: no client clock
//! times a lease.
//!
//! - acquire: Acquire Lease with a proposed lease id (a fresh UUID, noted here before the
//!   request goes, so that `abandon` can release a lease whose answer never came) for the
//!   lease's lifetime rounded up to whole seconds (Azure takes 15 to 60 s; `kind.rs` refuses
//!   any other before a run connects). A missing blob is created first, empty, with
//!   `If-None-Match: *`. Then, under the lease, Get Blob Properties and Set Blob Metadata:
//!   the new token, the holder, the lease id, the acquisition time and the duration. Only then
//!   is the lock won; if that write fails the lease is released. 409 (LeaseAlreadyPresent):
//!   held.
//! - renew: Renew Lease (the duration restarts from now), then, best effort, the renewal's
//!   time in the metadata (for `expires_in` only), with `If-Match` on the ETag of the metadata
//!   it rewrites, so that it never erases a keep that a release wrote since. A lease that is
//!   breaking, released or someone else's answers 409: lost.
//! - release: Release Lease. With --min-hold, the metadata first gets `leaderrun_kept_until`
//!   (acquisition + keep + the second a `Date` may hide, on the server's clock, so that it
//!   never ends early): the lease goes, but an acquirer that finds
//!   the keep running (judged against the `Date` of its own read) releases the lease it just
//!   took and reports the lock held. A keep that has passed by the holder's own elapsed time
//!   since its acquire was sent frees the lock at once. No wall clock is used anywhere.
//! - revoke (`leaderrun release`): Break Lease with a break period of 60 s, the longest Azure
//!   takes: Azure ends a breaking lease at the lesser of the period and what remains of the
//!   lease, so it ends exactly when it would have expired, never sooner, and the holder's
//!   deadline (which the timing rule puts before that) has passed by then. Meanwhile nobody
//!   can acquire it and the holder's renewal fails (409), so it stops its child and releases
//!   the breaking lease, which frees it at once. Only the holder may write a leased blob's
//!   metadata, so "revoked" is the lease state `breaking` itself. A lock only kept for
//!   --min-hold has no lease: the revoke takes one, clears the keep, and releases it.
//! - tokens: `max(stored token, floor) + 1`, where the floor follows the server's `Date`
//!   (`client_timed/server_clock.rs`: whole seconds × 1,000,000, the next second's when the
//!   blob has no token yet), so tokens outlive a deleted blob. An acquisition that found no
//!   token counts only once the server's clock has left the second its token was written in
//!   (at most a second more), with its lease and token unchanged: a blob deleted and made
//!   again cannot repeat a token.
//! - waiting: Azure cannot notify, so a standby reads the blob every 1 to 1.5 s
//!   (`poll_until_free`); that read sees an expiry as well as a release.
//!
//! The lease id is in the metadata, so that another client of the same identity (a run's
//! `abandon`, a fresh process) can renew or release it: anyone who may read the blob may
//! learn it, but leasing needs write permission, which breaks any lease anyway.
//!
//! A run first reads a blob that is never a lock's (`PREFIX.container-check`): its
//! BlobNotFound proves the container exists, where Get Container Properties would need more
//! than a container SAS or a user delegation SAS grants. A missing container is refused
//! (exit 69) naming it; nothing but blobs is ever created. A
//! wrong key, an expired SAS or a missing permission (403) is refused in one line, without
//! the key, the SAS or Azure's message (which quotes the signature).

mod api;
mod blob;
mod credentials;
mod kind;
mod list;
mod record;
mod target;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
pub use kind::{KIND, LEASE_LIMITS};
pub use target::Target;
use tokio::time::Instant;

use self::api::Api;
use self::blob::{Container, LeaseAnswer, Properties};
use self::record::{blob_of, kept_until, lock_of, millis, record, LeaseState, Meta};
use crate::store::client_timed::server_clock::{floor, token_counts};
use crate::store::{poll_until_free, Access, Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

/// How often a waiting standby reads the blob (1 to 1.5 × this, `poll_until_free`).
const POLL_EVERY: Duration = Duration::from_secs(1);
/// How often a new token's acquisition asks the server's clock while it settles.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// The blob (under the prefix) whose absence shows that the container exists: a lock's blob
/// never starts with `.` (`record.rs` writes it `%2E`).
const CONTAINER_CHECK: &str = ".container-check";
/// The break period of a revoke: the longest Azure takes, at least what remains of any lease.
const BREAK_PERIOD: &str = "60";

/// The Azure Blob store for `target`, with credentials from the environment.
pub async fn open(target: &Target, access: Access) -> Result<Box<dyn Store>> {
    Ok(Box::new(AzBlobStore::open(target, access).await?))
}

/// A lease this store took, as it knows it.
struct Taken {
    identity: String,
    token: u64,
    lease_id: String,
    meta: Meta,
    /// The blob's ETag after this store's latest metadata write (`None`: unknown, a write
    /// failed).
    etag: Option<String>,
    /// When its acquire was sent, on this host's elapsed-time clock.
    sent: Instant,
}

/// A lease of this identity, found in this store's note or in the blob's metadata.
struct Found {
    lease_id: String,
    meta: Meta,
    /// The ETag that `meta` was read or written with, if known.
    etag: Option<String>,
    /// When its acquire was sent, if this store took it.
    sent: Option<Instant>,
}

pub struct AzBlobStore {
    container: Container,
    prefix: String,
    taken: Mutex<HashMap<String, Taken>>,
    /// Lease ids proposed by acquires that have not answered yet: lock → (identity, id).
    proposed: Mutex<HashMap<String, (String, String)>>,
}

/// A new lease id: a random (version 4) UUID.
fn new_lease_id() -> String {
    let n = rand::random::<u128>() & !(0xf000 << 64) & !(0xc000 << 48) | (0x4000 << 64) | (0x8000 << 48);
    let hex = format!("{n:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The lease duration Azure is asked for: `ttl` rounded up to whole seconds (a longer server
/// lease is safe: the holder's deadline does not move), at least 15 s. A longer one than
/// 60 s cannot be kept (a run is refused before it connects, `kind.rs`).
pub fn lease_seconds(ttl: Duration) -> Result<u64> {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    let (least, most) = (LEASE_LIMITS.start().as_secs(), LEASE_LIMITS.end().as_secs());
    if seconds > most {
        return Err(StoreError::unfit(format!(
            "Azure Blob leases last {least} to {most} s; a lease of {seconds} s cannot be kept"
        )));
    }
    Ok(seconds.max(least))
}

impl AzBlobStore {
    /// The store, with credentials from the environment; a run (`Access::Create`) first checks
    /// that the container exists and takes the credentials.
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let account =
            credentials::from_env(target).map_err(|why| StoreError::refused(format!("{}: {why}", target.shown)))?;
        let store = Self::with_account(target, account)?;
        if access == Access::Create {
            store.check_container().await?;
        }
        Ok(store)
    }

    /// The store for `target` reached with `connection_string` instead of the environment
    /// (for tests, and programs that embed leaderrun), checked as `open` checks it.
    pub async fn open_with(target: &Target, access: Access, connection_string: &str) -> Result<Self> {
        let account = credentials::connection_string(connection_string, &target.account)
            .map_err(|why| StoreError::refused(format!("{}: {why}", target.shown)))?;
        let store = Self::with_account(target, account)?;
        if access == Access::Create {
            store.check_container().await?;
        }
        Ok(store)
    }

    fn with_account(target: &Target, account: credentials::Account) -> Result<Self> {
        let container =
            Container { api: Api::new(account)?, name: target.container.clone(), shown: target.shown.clone() };
        Ok(Self { container, prefix: target.prefix.clone(), taken: Mutex::default(), proposed: Mutex::default() })
    }

    /// Refuse a missing container, and credentials the server does not take.
    async fn check_container(&self) -> Result<()> {
        self.container.check_container(&format!("{}{CONTAINER_CHECK}", self.prefix)).await
    }

    /// Create the container (tests and embedders only: a run never creates one).
    pub async fn create_container(&self) -> Result<bool> {
        self.container.create_container().await
    }

    /// Delete a lock's blob, breaking its lease first, as an operator would with the Azure CLI
    /// (`az storage blob lease break`, `az storage blob delete`): for tests and embedders.
    pub async fn delete(&self, lock: &str) -> Result<()> {
        let blob = self.blob(lock)?;
        self.container.lease(&blob, "break", &[("x-ms-lease-break-period", "0".to_string())]).await?;
        self.container.delete(&blob).await
    }

    fn blob(&self, lock: &str) -> Result<String> {
        blob_of(&self.prefix, lock).map_err(|why| StoreError::refused(format!("{}: {why}", self.container.shown)))
    }

    async fn lease(&self, blob: &str, action: &str, lease_id: &str) -> Result<LeaseAnswer> {
        self.container.lease(blob, action, &[("x-ms-lease-id", lease_id.to_string())]).await
    }

    /// Release a lease, quietly: for clean-ups whose failure changes nothing (it then lapses).
    async fn let_go(&self, blob: &str, lease_id: &str) {
        if let Err(err) = self.lease(blob, "release", lease_id).await {
            tracing::debug!("releasing a lease it will not use failed (it lapses instead): {}", err.message);
        }
    }

    /// `lease`, if the blob still carries its token: from this store's own note, else from the
    /// metadata (another client of the same identity).
    async fn find(&self, lease: &Lease, blob: &str) -> Result<Option<Found>> {
        if let Some(t) = self.taken.lock().unwrap().get(&lease.lock) {
            if t.identity == lease.identity && t.token == lease.token {
                let (lease_id, meta, etag) = (t.lease_id.clone(), t.meta.clone(), t.etag.clone());
                return Ok(Some(Found { lease_id, meta, etag, sent: Some(t.sent) }));
            }
        }
        let (properties, _) = self.container.properties(blob).await?;
        Ok(properties.and_then(|p| {
            let ours = p.meta.holder.as_deref() == Some(&lease.identity) && p.meta.token == Some(lease.token);
            let lease_id = p.meta.lease.clone().filter(|_| ours)?;
            Some(Found { lease_id, meta: p.meta, etag: Some(p.etag), sent: None })
        }))
    }

    /// Note a renewal's time in the metadata (for `status` only), over the ETag of the metadata
    /// it rewrites: a --min-hold keep that a release wrote since (this store's, or the same
    /// identity's other client's) must not be erased, so a write that finds the ETag moved is
    /// dropped. With no ETag known (an earlier note failed), the blob is read first.
    async fn note_renewal(&self, lease: &Lease, blob: &str, found: Found, date: Option<SystemTime>) {
        let (meta, etag) = match found.etag {
            Some(etag) => (found.meta, etag),
            None => match self.container.properties(blob).await {
                Ok((Some(p), _)) => (p.meta, p.etag),
                _ => return,
            },
        };
        let meta = Meta { renewed_ms: millis(date).max(meta.renewed_ms), ..meta };
        let written = self.container.set_metadata(blob, &found.lease_id, &meta, Some(&etag)).await;
        if let Err(err) = &written {
            tracing::debug!("noting a renewal's time failed: {}", err.message);
        }
        let mut taken = self.taken.lock().unwrap();
        if let Some(t) = taken.get_mut(&lease.lock).filter(|t| t.lease_id == found.lease_id) {
            match written {
                Ok(Some(w)) => (t.meta, t.etag) = (meta, Some(w.etag)),
                _ => t.etag = None,
            }
        }
    }

    /// The record of a lock someone else was just found to hold. A lease taken a moment ago
    /// shows its holder once that holder's metadata write lands.
    async fn held_by_another(&self, lock: &str) -> Result<LockRecord> {
        let record = self.status(lock).await?;
        Ok(if record.is_held() { record } else { LockRecord { holder: Some("(being taken)".into()), ..record } })
    }

    /// Under a lease just acquired: check for a keep, write the new token, and wait until it
    /// counts (a blob's first token, or one above the current second's floor). `Ok(Err(record))`: a keep holds the lock.
    async fn take(
        &self,
        lock: &str,
        identity: &str,
        blob: &str,
        lease_id: &str,
        seconds: u64,
    ) -> Result<std::result::Result<(u64, Meta, String), LockRecord>> {
        let (Some(Properties { meta: stored, date, .. }), _) = self.container.properties(blob).await? else {
            return Err(StoreError::unavailable(format!(
                "{}: the blob of lock {lock:?} was deleted as it was taken",
                self.container.shown
            )));
        };
        if stored.kept_at(date) {
            return Ok(Err(record(lock, LeaseState::Free, &stored, date)));
        }
        let fresh = stored.token.is_none();
        let token = stored.token.unwrap_or(0).max(floor(date, !fresh)) + 1;
        let meta = Meta {
            token: Some(token),
            holder: Some(identity.to_string()),
            lease: Some(lease_id.to_string()),
            acquired_ms: millis(date),
            renewed_ms: millis(date),
            duration: seconds,
            kept_until_ms: 0,
        };
        let lost = || {
            StoreError::unavailable(format!(
                "{}: the lease on lock {lock:?} was lost before its token counted",
                self.container.shown
            ))
        };
        let Some(written) = self.container.set_metadata(blob, lease_id, &meta, None).await? else {
            return Err(lost());
        };
        // A token counts once no later create can be told a smaller floor: a fresh blob's
        // once its second is over, and so does any token above the current second's floor
        // (a takeover of a blob whose first token never counted, its settling read lost).
        let mut now = written.date;
        while !token_counts(token, now) {
            tokio::time::sleep(SETTLE_POLL).await;
            let (properties, date) = self.container.properties(blob).await?;
            match properties {
                Some(p) if p.lease == LeaseState::Leased && p.meta == meta => now = date,
                _ => return Err(lost()),
            }
        }
        Ok(Ok((token, meta, written.etag)))
    }

    /// End a --min-hold keep: take the lease, clear the keep, release it. Someone may hold the
    /// lease for a moment (an acquirer that will find the keep and let go): try again then.
    async fn end_keep(&self, lock: &str, blob: &str) -> Result<()> {
        for _ in 0..50 {
            let lease_id = new_lease_id();
            let seconds = LEASE_LIMITS.start().as_secs().to_string();
            let headers = [("x-ms-lease-duration", seconds), ("x-ms-proposed-lease-id", lease_id.clone())];
            match self.container.lease(blob, "acquire", &headers).await? {
                LeaseAnswer::NoBlob => return Ok(()),
                LeaseAnswer::Conflict => tokio::time::sleep(Duration::from_millis(100)).await,
                LeaseAnswer::Done(_) => {
                    let (properties, _) = self.container.properties(blob).await?;
                    let written = match properties {
                        Some(Properties { meta, .. }) if meta.kept_until_ms > 0 => {
                            let meta = Meta { kept_until_ms: 0, ..meta };
                            self.container.set_metadata(blob, &lease_id, &meta, None).await.map(drop)
                        }
                        _ => Ok(()),
                    };
                    self.let_go(blob, &lease_id).await;
                    return written;
                }
            }
            if !self.status(lock).await?.kept {
                return Ok(());
            }
        }
        Err(StoreError::unavailable(format!(
            "{}: the keep of lock {lock:?} could not be ended: its blob stays leased",
            self.container.shown
        )))
    }
}

#[async_trait]
impl Store for AzBlobStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let blob = self.blob(lock)?;
        let seconds = lease_seconds(ttl)?;
        for _ in 0..3 {
            let lease_id = new_lease_id();
            self.proposed.lock().unwrap().insert(lock.to_string(), (identity.to_string(), lease_id.clone()));
            let sent = Instant::now();
            let headers = [("x-ms-lease-duration", seconds.to_string()), ("x-ms-proposed-lease-id", lease_id.clone())];
            let mut answer = self.container.lease(&blob, "acquire", &headers).await?;
            if answer == LeaseAnswer::NoBlob {
                self.container.create(&blob).await?;
                answer = self.container.lease(&blob, "acquire", &headers).await?;
            }
            match answer {
                LeaseAnswer::NoBlob => continue, // deleted as soon as it was made
                LeaseAnswer::Conflict => {
                    self.proposed.lock().unwrap().remove(lock);
                    return Ok(Acquire::Held(self.held_by_another(lock).await?));
                }
                LeaseAnswer::Done(_) => {}
            }
            let taken = self.take(lock, identity, &blob, &lease_id, seconds).await;
            if !matches!(taken, Ok(Ok(_))) {
                self.let_go(&blob, &lease_id).await;
            }
            self.proposed.lock().unwrap().remove(lock);
            let (token, meta, etag) = match taken? {
                Ok(won) => won,
                Err(kept) => return Ok(Acquire::Held(kept)),
            };
            let note = Taken { identity: identity.to_string(), token, lease_id, meta, etag: Some(etag), sent };
            self.taken.lock().unwrap().insert(lock.to_string(), note);
            return Ok(Acquire::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token }));
        }
        Err(StoreError::unavailable(format!("{}: the blob of lock {lock:?} keeps vanishing", self.container.shown)))
    }

    async fn renew(&self, lease: &Lease, _ttl: Duration) -> Result<Renew> {
        let blob = self.blob(&lease.lock)?;
        let Some(found) = self.find(lease, &blob).await? else {
            return Ok(Renew::Lost(Some(self.status(&lease.lock).await?)));
        };
        match self.lease(&blob, "renew", &found.lease_id).await? {
            LeaseAnswer::Done(date) => {
                self.note_renewal(lease, &blob, found, date).await;
                Ok(Renew::Renewed)
            }
            LeaseAnswer::Conflict | LeaseAnswer::NoBlob => {
                self.taken.lock().unwrap().remove(&lease.lock);
                Ok(Renew::Lost(self.status(&lease.lock).await.ok()))
            }
        }
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let blob = self.blob(&lease.lock)?;
        let Some(Found { lease_id, meta, sent, .. }) = self.find(lease, &blob).await? else { return Ok(()) };
        // A keep that has passed by this host's own count frees the lock now.
        if !keep.is_zero() && sent.is_none_or(|sent| sent.elapsed() < keep) {
            let kept_until_ms = kept_until(meta.acquired_ms, keep);
            // A lease that is breaking may refuse the write: it is released all the same.
            self.container.set_metadata(&blob, &lease_id, &Meta { kept_until_ms, ..meta }, None).await?;
        }
        self.lease(&blob, "release", &lease_id).await?;
        let mut taken = self.taken.lock().unwrap();
        if taken.get(&lease.lock).is_some_and(|t| t.lease_id == lease_id) {
            taken.remove(&lease.lock);
        }
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let blob = self.blob(lock)?;
        Ok(match self.container.properties(&blob).await? {
            (Some(p), date) => record(lock, p.lease, &p.meta, date),
            (None, _) => LockRecord::free(lock),
        })
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let (mut records, mut marker) = (Vec::new(), None::<String>);
        loop {
            let (page, date) = self.container.list(&self.prefix, marker.as_deref()).await?;
            for blob in page.blobs {
                let Some(lock) = lock_of(&self.prefix, &blob.name) else { continue };
                let lease = LeaseState::parse(&blob.lease_state);
                records.push(record(&lock, lease, &Meta::parse(&blob.metadata), date));
            }
            marker = page.next_marker;
            if marker.is_none() {
                break;
            }
        }
        records.sort_by(|a, b| a.lock.cmp(&b.lock));
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let blob = self.blob(lock)?;
        let (Some(properties), date) = self.container.properties(&blob).await? else { return Ok(None) };
        let before = record(lock, properties.lease, &properties.meta, date);
        if !before.is_held() {
            return Ok(None);
        }
        match properties.lease {
            // Kept for --min-hold (a lease on it now is an acquirer's, about to let go).
            _ if before.kept => self.end_keep(lock, &blob).await?,
            LeaseState::Leased => {
                let headers = [("x-ms-lease-break-period", BREAK_PERIOD.to_string())];
                self.container.lease(&blob, "break", &headers).await?;
            }
            // Breaking already: revoked before.
            LeaseState::Breaking | LeaseState::Free => {}
        }
        Ok(Some(before))
    }

    /// Release the lease this identity's acquire proposed (its answer may never have come),
    /// and any lease of this identity whose id the metadata holds.
    async fn abandon(&self, lock: &str, identity: &str) -> Result<()> {
        let blob = self.blob(lock)?;
        let proposed = self.proposed.lock().unwrap().remove(lock);
        if let Some((_, lease_id)) = proposed.filter(|(who, _)| who == identity) {
            self.lease(&blob, "release", &lease_id).await?;
        }
        let (properties, _) = self.container.properties(&blob).await?;
        if let Some(p) = properties.filter(|p| p.lease != LeaseState::Free) {
            if let Some(lease_id) = p.meta.lease.filter(|_| p.meta.holder.as_deref() == Some(identity)) {
                self.lease(&blob, "release", &lease_id).await?;
            }
        }
        let mut taken = self.taken.lock().unwrap();
        if taken.get(lock).is_some_and(|t| t.identity == identity) {
            taken.remove(lock);
        }
        Ok(())
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        poll_until_free(self, lock, max_wait, POLL_EVERY).await
    }

    /// Its polls read the blob, which shows an expired lease as free.
    fn sees_expiry(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_version_4_uuids() {
        let id = new_lease_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, new_lease_id());
    }

    #[test]
    fn lease_durations_round_up_within_azures_range() {
        let s = Duration::from_secs;
        assert_eq!(lease_seconds(s(15)).unwrap(), 15);
        assert_eq!(lease_seconds(Duration::from_millis(20_001)).unwrap(), 21);
        assert_eq!(lease_seconds(Duration::from_millis(300)).unwrap(), 15, "longer is safe");
        assert_eq!(lease_seconds(s(60)).unwrap(), 60);
        let err = lease_seconds(Duration::from_millis(60_001)).unwrap_err();
        assert!(err.kind == crate::store::ErrorKind::Unfit && err.message.contains("15 to 60 s"), "{err:?}");
    }
}
