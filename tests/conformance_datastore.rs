//! The conformance suite and the client-timed stores' suite (tests/client_timed/: its
//! guarded writes, racing writes, tokens that outlive a deleted entity, a deletion's
//! overlap) against Google's Datastore emulator (one emulator per test); and what only this
//! store has: the nonce that makes every write change the version, namespaces and kinds,
//! and refusals: reserved names, a server that ignores `baseVersion` (the Firestore
//! emulator's behaviour, played by a tiny fake), Firestore in Native mode, a 403.
//!
//! The emulator must be installed (see tests/servers/datastore_emulator.rs): without it
//! these tests fail, saying how to get it.

mod client_timed;
mod conformance;
mod servers;

use std::sync::Arc;

use async_trait::async_trait;
use client_timed::{fake_http, record, RecordsHarness, Reply};
use conformance::{unique, won, Harness, TTL};
use leaderrun::store::client_timed::{Created, Records, Version, Written};
use leaderrun::store::datastore::{open_with, DatastoreRecords, Target};
use leaderrun::store::google::{GoogleApi, Service};
use leaderrun::store::Access;
use leaderrun::store::{ErrorKind, Store, StoreError};
use serde_json::{json, Value};
use servers::datastore_emulator::{DatastoreEmulator, PROJECT};

struct DatastoreHarness {
    server: DatastoreEmulator,
}

async fn emulator() -> DatastoreEmulator {
    tokio::task::spawn_blocking(DatastoreEmulator::start).await.unwrap()
}

async fn datastore() -> DatastoreHarness {
    DatastoreHarness { server: emulator().await }
}

fn api(host: &str) -> GoogleApi {
    GoogleApi::emulator(Service::Datastore, host).unwrap()
}

async fn open_url(host: &str, url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid URL");
    open_with(&target, access, api(host)).await.map(Arc::from)
}

async fn records(server: &DatastoreEmulator) -> DatastoreRecords {
    let target = Target::parse(&server.url()).unwrap();
    DatastoreRecords::open_with(&target, Access::Create, api(&server.host())).await.unwrap()
}

/// One REST call to the emulator, as another tool would make it.
async fn rest(server: &DatastoreEmulator, method: &str, body: Value) -> Value {
    let url = format!("http://{}/v1/projects/{PROJECT}:{method}", server.host());
    let response = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    assert!(response.status().is_success(), "{method}: {}", response.status());
    response.json().await.unwrap()
}

fn key(namespace: &str, kind: &str, name: &str) -> Value {
    let mut partition = json!({"projectId": PROJECT});
    if !namespace.is_empty() {
        partition["namespaceId"] = json!(namespace);
    }
    json!({"partitionId": partition, "path": [{"kind": kind, "name": name}]})
}

async fn delete(server: &DatastoreEmulator, lock: &str) {
    let mutation = json!({"delete": key("", "Lease", lock)});
    rest(server, "commit", json!({"mode": "NON_TRANSACTIONAL", "mutations": [mutation]})).await;
}

#[async_trait]
impl Harness for DatastoreHarness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.host(), &self.server.url(), Access::Create).await.expect("open the datastore store")
    }

    /// SIGTERM and start again: the emulator saves its data only when it stops cleanly.
    async fn restart(&self) {
        tokio::task::block_in_place(|| {
            self.server.stop();
            self.server.start_again();
        });
    }
}

#[async_trait]
impl RecordsHarness for DatastoreHarness {
    type Records = DatastoreRecords;
    type Server = DatastoreEmulator;

    async fn records(&self) -> DatastoreRecords {
        records(&self.server).await
    }

    async fn delete(&self, lock: &str) {
        delete(&self.server, lock).await;
    }

    fn server(&self) -> &DatastoreEmulator {
        &self.server
    }

    async fn open_unreachable(port: u16) -> (String, Result<Box<dyn Store>, StoreError>) {
        let target = Target::parse("datastore://some-project").unwrap();
        ("datastore://some-project".into(), open_with(&target, Access::Create, api(&format!("127.0.0.1:{port}"))).await)
    }
}

conformance_suite!(datastore());
client_timed_suite!(DatastoreHarness, datastore());

/// A version is the entity's version and a nonce: the current entity version with another
/// nonce (another record at that version, as after an emulator restart, which reuses
/// versions) is a stale version, refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_with_another_nonce_is_refused() {
    let server = emulator().await;
    let (a, b) = (records(&server).await, records(&server).await);
    let lock = unique("nonce");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    let (entity_version, _) = second.0.split_once(' ').unwrap();
    let lookalike = Version(format!("{entity_version} 12345"));
    assert_eq!(a.replace(&lock, &record("a", 3), &lookalike).await.unwrap(), Written::Moved, "the nonce is compared");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b", "the refused replace wrote nothing");
}

/// Datastore gives a write that changes nothing the version the entity already had; the
/// nonce makes the same record written twice two versions, so a standby sees the renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_record_written_again_changes_the_version() {
    let server = emulator().await;
    let a = records(&server).await;
    let lock = unique("noop");
    let same = record("a", 1);
    let Created::Done { version: mut last, .. } = a.create(&lock, &same).await.unwrap() else { panic!("create") };
    for _ in 0..3 {
        let Written::Done(next) = a.replace(&lock, &same, &last).await.unwrap() else { panic!("rewrite") };
        assert_ne!(next, last, "an identical rewrite must change the version");
        assert_eq!(a.read(&lock).await.unwrap().found.unwrap().version, next);
        last = next;
    }
    // Without the nonce the emulator would answer with the version it had (checked here on
    // the raw API: the same properties written twice).
    let entity = json!({"key": key("", "Lease", &format!("{lock}-raw")), "properties": {"x": {"integerValue": "1"}}});
    let v1 = rest(&server, "commit", json!({"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": entity}]})).await;
    let v2 = rest(&server, "commit", json!({"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": entity}]})).await;
    assert_eq!(v1["mutationResults"][0]["version"], v2["mutationResults"][0]["version"], "a no-op keeps its version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespaces_and_kinds_are_separate_and_list_shows_only_locks() {
    let server = emulator().await;
    let host = server.host();
    let url = format!("{}/team-a?kind=Leader", server.url());
    let store = open_url(&host, &url, Access::Create).await.unwrap();
    let lock = format!("a/b %.{}", unique("key"));
    won(&*store, &lock, "a", TTL).await;
    // Someone else's entity of the kind is not a lock, and does not break the list.
    let foreign = json!({"key": key("team-a", "Leader", "notes"), "properties": {"x": {"stringValue": "hi"}}});
    rest(&server, "commit", json!({"mode": "NON_TRANSACTIONAL", "mutations": [{"insert": foreign}]})).await;
    let names: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    assert_eq!(names, vec![lock.clone()], "the probe's entities are gone, the foreign one skipped");
    let found = rest(&server, "lookup", json!({"keys": [key("team-a", "Leader", &lock)]})).await;
    assert_eq!(found["found"][0]["entity"]["properties"]["holder"]["stringValue"], "a");
    // The default namespace and kind hold another set of locks.
    let other = open_url(&host, &server.url(), Access::Create).await.unwrap();
    won(&*other, &lock, "b", TTL).await;
    assert_eq!(other.list().await.unwrap().len(), 1);
    let elsewhere = open_url(&host, &format!("{}/team-a", server.url()), Access::Existing).await.unwrap();
    assert!(elsewhere.list().await.unwrap().is_empty(), "kind Lease in team-a holds nothing");
}

/// A list longer than the emulator's batches comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_list_comes_back_whole() {
    let server = emulator().await;
    let store = open_url(&server.host(), &server.url(), Access::Create).await.unwrap();
    let a = records(&server).await;
    for i in 0..1200 {
        let Created::Done { version: _, .. } = a.create(&format!("many-{i:04}"), &record("x", 1)).await.unwrap() else {
            panic!()
        };
    }
    assert_eq!(store.list().await.unwrap().len(), 1200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserved_lock_names_are_refused() {
    let server = emulator().await;
    let store = open_url(&server.host(), &server.url(), Access::Create).await.unwrap();
    let err = store.acquire("__scatter__", "a", TTL).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("two underscores"), "{}", err.message);
    won(&*store, "__not reserved", "a", TTL).await;
}

/// A fake Datastore that answers every request with `answer(path)`: (status, JSON body).
macro_rules! fake {
    ($answer:expr) => {
        fake_http(|path| {
            let answer: fn(&str) -> (u16, Value) = $answer;
            let (status, body) = answer(path);
            Reply::json(&format!("{status} X"), "application/json", body.to_string())
        })
    };
}

async fn refusal(host: &str, access: Access) -> StoreError {
    let target = Target::parse("datastore://careless-project").unwrap();
    let store = open_with(&target, access, api(host)).await;
    let err = match store {
        Err(err) => err,
        Ok(store) => store.status("x").await.expect_err("refused"),
    };
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.starts_with("datastore://careless-project: ") && !err.message.contains('\n'), "{err:?}");
    err
}

/// A server that applies every commit, `baseVersion` or not, as the Firestore emulator in
/// Datastore mode does: renewals could not tell a lost race. Refused when a run opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_base_version_is_refused_at_open() {
    let host = fake!(|_| (200, json!({"mutationResults": [{"version": "1795425211452391"}]})));
    let err = refusal(&host, Access::Create).await;
    assert!(err.message.contains("ignores baseVersion") && err.message.contains("Firestore emulator"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn firestore_in_native_mode_is_refused_by_name() {
    let host = fake!(|_| {
        let message = "The Cloud Datastore API is not available for Firestore in Native mode database \
                       projects/careless-project/databases/(default).";
        (400, json!({"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}}))
    });
    let err = refusal(&host, Access::Existing).await;
    assert!(err.message.contains("Firestore in Native mode") && err.message.contains("Datastore mode"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permission_denied_is_refused_in_one_line() {
    let host = fake!(|path| {
        assert!(path.starts_with("/v1/projects/careless-project:"), "{path}");
        let message = "Missing or insufficient permissions.";
        (403, json!({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}}))
    });
    for access in [Access::Create, Access::Existing] {
        let err = refusal(&host, access).await;
        assert!(err.message.contains("HTTP 403 PERMISSION_DENIED: Missing or insufficient"), "{err:?}");
    }
}
