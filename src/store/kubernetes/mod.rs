//! Kubernetes Leases (`coordination.k8s.io/v1`), written as client-go's LeaseLock writes
//! them, so kubectl and client-go electors see and respect leaderrun's leases and the
//! other way round.
//!
//! The API server has no lease expiry: a Lease is a record that only clients interpret.
//! This store is record I/O for the client-timed core (`store::client_timed`), which owns
//! every timing rule; here: one Lease per lock (`names.rs`), a record as client-go writes
//! it (`lease.rs`), the requests (`api.rs`) and finding the cluster (`connect.rs`).
//!
//! Requests per call: a read is one GET (two when the Lease does not exist: a LIST by name
//! then gives the floor); a write is one POST or PUT; a waiting standby keeps one watch
//! open on the Lease (`feed.rs`) and asks nothing else while the holder renews.
//! `leaderrun watch` keeps one watch of its own on the Lease (`observe.rs`), and writes nothing.
//!
//! Fencing tokens assume what every Kubernetes API server backed by etcd does: a
//! resourceVersion is the etcd revision of the write, one number for the whole cluster
//! that only grows. The API conventions call resourceVersions opaque; a server that
//! issued them otherwise (not etcd-backed, or a restore from an older backup) would break
//! the tokens' promise to grow, not the mutual exclusion.

mod api;
mod connect;
mod feed;
mod kind;
mod lease;
mod names;
mod observe;
mod target;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;

use super::client_timed::{client_timed, Created, Feed, Found, Read, Record, Records, Version, Written};
use super::Access;
use super::{Observing, Result, Store};
use api::LeaseApi;
pub use kind::KIND;
pub use target::Target;

/// The Leases of one namespace, as records.
pub struct LeaseRecords {
    api: Arc<LeaseApi>,
    seen: Arc<LastSeen>,
    /// `leaderrun watch`'s watch on a Lease, kept across `observe_change` calls.
    observed: tokio::sync::Mutex<Option<observe::Observed>>,
    /// The lock and resourceVersion of the last read: a watcher's watch starts after it.
    read_at: Mutex<Option<(String, String)>>,
}

/// Each lock's Lease as last read, written or watched: a replace starts from it, so that
/// what peers put on the Lease (labels, annotations) is carried over.
#[derive(Default)]
pub(crate) struct LastSeen(Mutex<HashMap<String, Lease>>);

impl LastSeen {
    /// The record and version of `lease`, now the last seen of `lock`.
    fn found(&self, lock: &str, lease: Lease) -> Option<Found> {
        let found = lease::found_of(&lease)?;
        self.0.lock().unwrap().insert(lock.to_string(), lease);
        Some(found)
    }

    /// The Lease to start a replace of `version` from: as last seen if that was this
    /// version, else a bare one (a peer's metadata is then lost, which only a client that
    /// writes without reading first would cause).
    fn base(&self, lock: &str, version: &Version) -> Lease {
        let seen = self.0.lock().unwrap().get(lock).cloned();
        seen.filter(|lease| lease::version_of(lease).as_ref() == Some(version))
            .unwrap_or_else(|| lease::new_lease(&names::lease_name(lock)))
    }
}

/// Open the store: the core over the Leases of the target's namespace. Nothing is asked of
/// the server yet; a first request shows whether the cluster is reachable and lets us in.
pub async fn open(target: &Target, _access: Access) -> Result<Box<dyn Store>> {
    let (client, namespace, server) = connect::connect(target).await?;
    let api = Arc::new(LeaseApi::new(client, namespace, &server));
    Ok(client_timed(Arc::new(LeaseRecords {
        api,
        seen: Arc::default(),
        observed: Default::default(),
        read_at: Default::default(),
    })))
}

impl LeaseRecords {
    fn found(&self, lock: &str, lease: Lease) -> Option<Found> {
        self.seen.found(lock, lease)
    }

    fn written(&self, lock: &str, lease: Option<Lease>) -> Written {
        match lease.and_then(|lease| self.found(lock, lease)) {
            Some(found) => Written::Done(found.version),
            None => Written::Moved,
        }
    }
}

#[async_trait]
impl Records for LeaseRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        let name = names::lease_name(lock);
        let got = self.api.get(&name).await?;
        if let Some(lease) = got.value {
            self.note_read(lock, lease.metadata.resource_version.clone());
            // Its resourceVersion is the floor: the write that put the last token there, and
            // every renewal since, came later, so it is at least that token.
            let floor = lease::revision(lease.metadata.resource_version.as_deref());
            return Ok(Read { found: self.found(lock, lease), server_time: got.date, floor });
        }
        // No Lease (never written, or deleted): the list's resourceVersion is the cluster's
        // latest revision, above every token the deleted Lease ever carried. The LIST also
        // sees a Lease created since the GET.
        let listed = self.api.list(Some(&name)).await?;
        self.note_read(lock, listed.value.resource_version.clone());
        let floor = lease::revision(listed.value.resource_version.as_deref());
        let found = listed.value.items.into_iter().next().and_then(|lease| self.found(lock, lease));
        Ok(Read { found, server_time: listed.date, floor })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        let lease = lease::with_record(lease::new_lease(&names::lease_name(lock)), lock, record);
        let created = self.api.create(&lease).await?;
        let revision = lease::revision(created.as_ref().and_then(|l| l.metadata.resource_version.as_deref()));
        Ok(match self.written(lock, created) {
            // Every token is at most the revision of the write that carried it (one more than a
            // revision read before it), and every write before this create has a lower one.
            Written::Done(version) => Created::Done { version, floor: revision.saturating_sub(1) },
            Written::Moved => Created::Moved,
        })
    }

    async fn replace(&self, lock: &str, record: &Record, version: &Version) -> Result<Written> {
        let Some((resource_version, uid)) = lease::parts(version) else { return Ok(Written::Moved) };
        let mut lease = lease::with_record(self.seen.base(lock, version), lock, record);
        lease.metadata.resource_version = Some(resource_version.to_string());
        lease.metadata.uid = Some(uid.to_string());
        let name = names::lease_name(lock);
        Ok(self.written(lock, self.api.replace(&name, &lease).await?))
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        let listed = self.api.list(None).await?;
        let mut locks = Vec::new();
        for lease in &listed.value.items {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            let annotated = lease.metadata.annotations.as_ref().and_then(|a| a.get(lease::LOCK));
            if let Some(lock) = names::lock_name(name, annotated.map(String::as_str)) {
                locks.push((lock, lease::record_of(lease)));
            }
        }
        Ok(locks)
    }

    /// The server's clock is the HTTP `Date`, in whole seconds.
    fn server_clock_resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn changed(&self, lock: &str, version: Option<&Version>, max_wait: Duration) {
        let name = names::lease_name(lock);
        let from = version.and_then(lease::parts).map(|(resource_version, _)| resource_version);
        super::watch_at_most(self.api.watch_once(&name, from, max_wait), max_wait).await
    }

    /// A watch kept open on the one Lease (`feed.rs`): a waiting standby then makes no
    /// request but this while the holder renews.
    async fn watch(&self, lock: &str, version: &Version) -> Result<Option<Feed>> {
        feed::open(self.api.clone(), self.seen.clone(), lock, version).await.map(Some)
    }

    /// Every change to the record is a write to the Lease, which the watch shows. A lapse
    /// is no change at all (the record keeps its holder until a standby takes it over, a
    /// write): `watch` needs no read at the expiry it saw, only at the next write.
    fn observing(&self) -> Observing {
        Observing::Pushes
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.observe(lock), max_wait).await
    }
}
