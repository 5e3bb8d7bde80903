//! Datastore store: `--store datastore://PROJECT[/NAMESPACE][?kind=Lease&database=ID]`, one
//! entity per lock (`entity.rs`), with no server-side expiry: the client-timed core judges
//! every lease on this host's clock, and this file only reads and writes entities, over the
//! Datastore v1 REST API (`api.rs`). Firestore in Datastore mode is the same API (it is
//! what Google now runs for every Datastore database); Firestore in Native mode does not
//! serve it and is refused in one line.
//!
//! - read: `lookup`, strongly consistent. The version is the entity's version with the
//!   entity's `nonce`; the token floor is the version the lookup reports, of the entity or,
//!   for a missing one, of the snapshot read. Datastore documents that both only grow, so
//!   the floor covers every token written before, the entity's deletion notwithstanding.
//!   The server's clock is the answer's `readTime`; the Datastore emulator sends none, and
//!   a `--min-hold` keep is then judged on this host's wall clock.
//! - create: `commit` NON_TRANSACTIONAL `insert` (409 ALREADY_EXISTS: someone else created
//!   it first).
//! - replace: `lookup` in a new transaction; if the entity is not at the expected version
//!   and nonce, `rollback` and report a lost race; else `commit` the transaction with an
//!   `update` that also carries `baseVersion`. A conflict (`conflictDetected`, 409 ABORTED),
//!   a deleted entity (404) or a transaction the server no longer knows (400, as after an
//!   emulator restart) is a lost race. The transaction, not a bare `baseVersion` commit, is
//!   what makes a delayed renewal safe where versions repeat (the emulator restarts its
//!   version counter): the nonce in the comparison tells two records at one version apart.
//! - list: `runQuery` of the kind in the namespace, page by page.
//! - waiting: Datastore mode cannot notify, so a standby's core sends a `lookup` every 1 to
//!   1.5 s (`client_timed/polls.rs`) and judges what each read shows: at most 3,600 entity
//!   reads an hour per waiting process, and nothing more when the holder renews.
//!
//! Deleting a lock's entity frees the lock at once (its holder sees it at its next renewal
//! and stops its child). A run first checks that the server honours `baseVersion`
//! (`probe.rs`). 401 and 403 are refusals (exit 69), in one line naming the URL and the call;
//! no message carries a token.

mod api;
mod entity;
mod kind;
mod probe;
mod target;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{json, Value};

pub use entity::check_lock_name;
pub use kind::KIND;
pub use target::Target;

use self::api::{Answer, Api};
use self::entity::{entity, name_of, number, parse_version, record, version, Place};
use crate::store::client_timed::{client_timed, Created, Found, Read, Record, Records, Version, Written};
use crate::store::google::{GoogleApi, Service};
use crate::store::Access;
use crate::store::{Result, Store, StoreError};

/// How often a waiting standby reads the entity (`Records::poll_every`: 1 to 1.5 × this).
const POLL_EVERY: Duration = Duration::from_secs(1);

/// The Datastore store for `target`: the client-timed core over its entities, at the API
/// `DATASTORE_EMULATOR_HOST` names, or Google's with Application Default Credentials.
pub async fn open(target: &Target, access: Access) -> Result<Box<dyn Store>> {
    let api = GoogleApi::open(Service::Datastore).map_err(|e| StoreError { message: prefixed(target, &e), ..e })?;
    open_with(target, access, api).await
}

/// `open` with an API of the caller's (for tests that run several emulators in one
/// process, and for a program that embeds leaderrun).
pub async fn open_with(target: &Target, access: Access, api: GoogleApi) -> Result<Box<dyn Store>> {
    Ok(client_timed(Arc::new(DatastoreRecords::open_with(target, access, api).await?)))
}

fn prefixed(target: &Target, err: &StoreError) -> String {
    format!("{}: {}", target.shown, err.message)
}

/// One namespace's lock entities of one kind.
pub struct DatastoreRecords {
    api: Api,
}

/// One lookup of one key: the entity (if found) with its version, the version the lookup
/// reports (the entity's, or the snapshot's), the server's clock, and the transaction it
/// began, if asked to.
struct Looked {
    found: Option<(Value, u64)>,
    version: u64,
    read_time: Option<SystemTime>,
    transaction: Option<Value>,
}

impl DatastoreRecords {
    /// A client of `target`'s entities; a run (`Access::Create`) first checks that the
    /// server honours `baseVersion`.
    pub async fn open_with(target: &Target, access: Access, google: GoogleApi) -> Result<Self> {
        let place = Place {
            project: target.project.clone(),
            database: target.database.clone(),
            namespace: target.namespace.clone(),
            kind: target.kind.clone(),
        };
        let records = Self { api: Api::new(google, place, target.shown.clone()) };
        if access == Access::Create {
            probe::check_base_version(&records.api).await?;
        }
        Ok(records)
    }

    fn check(&self, lock: &str) -> Result<()> {
        check_lock_name(lock).map_err(|why| StoreError::refused(format!("{}: {why}", self.api.shown)))
    }

    /// `lookup` of `lock`'s entity; in a new read-write transaction if `transactional`.
    async fn lookup(&self, lock: &str, transactional: bool) -> Result<Looked> {
        let mut body = json!({"keys": [self.api.place.key(lock)]});
        if transactional {
            body["readOptions"] = json!({"newTransaction": {"readWrite": {}}});
        }
        let what = self.api.place.shown(lock);
        let answer = self.api.call_ok("lookup", &what, body).await?;
        let unreadable = |why: &str| StoreError::refused(format!("{}: lookup {what}: {why}", self.api.shown));
        let transaction = answer.get("transaction").cloned();
        let read_time = answer["readTime"].as_str().and_then(|t| humantime::parse_rfc3339_weak(t).ok());
        let (found, result) = match (answer["found"].get(0), answer["missing"].get(0)) {
            (Some(found), _) => (true, found),
            (None, Some(missing)) => (false, missing),
            // A key the server put off (`deferred`): it was busy.
            (None, None) => {
                if let Some(transaction) = &transaction {
                    self.api.rollback(&what, transaction).await;
                }
                return Err(StoreError::unavailable(format!(
                    "{}: lookup {what}: the server deferred it",
                    self.api.shown
                )));
            }
        };
        let version = number(&result["version"]).ok_or_else(|| unreadable("no version in the answer"))?;
        let found = found.then(|| (result["entity"].clone(), version));
        Ok(Looked { found, version, read_time, transaction })
    }

    /// The record of a found entity and its version; a refusal naming the entity if it is
    /// not leaderrun's.
    fn found(&self, lock: &str, entity: &Value, entity_version: u64) -> Result<Found> {
        let (record, nonce) = record(entity).map_err(|why| {
            StoreError::refused(format!("{}: {} is {why}", self.api.shown, self.api.place.shown(lock)))
        })?;
        Ok(Found { record, version: version(entity_version, nonce) })
    }

    /// Commit `mutation` (with a fresh nonce in `nonce`): the new version, or `None` on a
    /// lost race (a conflict, an entity already there or gone, an expired transaction).
    async fn commit(
        &self,
        lock: &str,
        what: &str,
        transaction: Option<&Value>,
        mutation: Value,
    ) -> Result<Option<u64>> {
        let mut body = json!({"mode": "NON_TRANSACTIONAL", "mutations": [mutation]});
        if let Some(transaction) = transaction {
            body["mode"] = json!("TRANSACTIONAL");
            body["transaction"] = transaction.clone();
        }
        let shown = format!("{} ({what})", self.api.place.shown(lock));
        match self.api.call("commit", &shown, body).await? {
            Answer::Ok(done) => {
                let result = &done["mutationResults"][0];
                if result["conflictDetected"] == json!(true) {
                    return Ok(None);
                }
                let version = number(&result["version"]).ok_or_else(|| {
                    StoreError::refused(format!("{}: commit {shown}: no version in the answer", self.api.shown))
                })?;
                Ok(Some(version))
            }
            Answer::Failed(failure) => match (failure.status, failure.code.as_str()) {
                (409, "ALREADY_EXISTS" | "ABORTED") | (404, _) => Ok(None),
                (400, "INVALID_ARGUMENT") if failure.message.to_ascii_lowercase().contains("transaction") => Ok(None),
                _ => Err(failure.into_error()),
            },
        }
    }
}

#[async_trait]
impl Records for DatastoreRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        self.check(lock)?;
        let looked = self.lookup(lock, false).await?;
        let found = match &looked.found {
            Some((entity, v)) => Some(self.found(lock, entity, *v)?),
            None => None,
        };
        Ok(Read { found, server_time: looked.read_time, floor: looked.version })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        self.check(lock)?;
        let (entity, nonce) = entity(self.api.place.key(lock), record);
        Ok(match self.commit(lock, "insert", None, json!({"insert": entity})).await? {
            // Every token is at most the version of the commit that wrote it (one more than a
            // version read before that commit), and every commit before this one has a lower one.
            Some(v) => Created::Done { version: version(v, nonce), floor: v.saturating_sub(1) },
            None => Created::Moved,
        })
    }

    async fn replace(&self, lock: &str, record: &Record, previous: &Version) -> Result<Written> {
        self.check(lock)?;
        let looked = self.lookup(lock, true).await?;
        let what = self.api.place.shown(lock);
        let Some(transaction) = looked.transaction else {
            return Err(StoreError::refused(format!(
                "{}: lookup {what}: the server began no transaction",
                self.api.shown
            )));
        };
        let current = match &looked.found {
            Some((entity, v)) => match self.found(lock, entity, *v) {
                Ok(found) => Some(found.version),
                Err(err) => {
                    self.api.rollback(&what, &transaction).await;
                    return Err(err);
                }
            },
            None => None,
        };
        if current.as_ref() != Some(previous) {
            self.api.rollback(&what, &transaction).await;
            return Ok(Written::Moved);
        }
        let (base, _) = parse_version(previous);
        let (entity, nonce) = entity(self.api.place.key(lock), record);
        let update = json!({"update": entity, "baseVersion": base.to_string()});
        Ok(match self.commit(lock, "update", Some(&transaction), update).await? {
            Some(v) => Written::Done(version(v, nonce)),
            None => Written::Moved,
        })
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        let mut locks = Vec::new();
        let mut cursor: Option<Value> = None;
        let what = format!("kind {}", self.api.place.kind);
        loop {
            let mut query = json!({"kind": [{"name": self.api.place.kind}]});
            if let Some(cursor) = &cursor {
                query["startCursor"] = cursor.clone();
            }
            let body = json!({"partitionId": self.api.place.partition(), "query": query});
            let answer = self.api.call_ok("runQuery", &what, body).await?;
            let batch = &answer["batch"];
            let results = batch["entityResults"].as_array().map(Vec::as_slice).unwrap_or_default();
            for result in results {
                let entity = &result["entity"];
                let Some(lock) = name_of(entity) else { continue }; // a numeric ID: not a lock
                if lock.starts_with(probe::PROBE_PREFIX) || check_lock_name(lock).is_err() {
                    continue;
                }
                match record(entity) {
                    Ok((record, _)) => locks.push((lock.to_string(), record)),
                    // Someone else's entity of the kind: not a lock, and no reason to fail.
                    Err(why) => tracing::warn!("{}: {} is {why}", self.api.shown, self.api.place.shown(lock)),
                }
            }
            // The emulator says MORE_RESULTS_AFTER_LIMIT even when there is no limit: an empty
            // batch (or a cursor that does not move) is the end there.
            let next = batch.get("endCursor").cloned();
            if results.is_empty()
                || batch["moreResults"] == json!("NO_MORE_RESULTS")
                || next.is_none()
                || next == cursor
            {
                return Ok(locks);
            }
            cursor = next;
        }
    }

    fn poll_every(&self) -> Option<Duration> {
        Some(POLL_EVERY)
    }
}
