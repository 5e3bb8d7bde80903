//! The conformance suite against Google's Datastore emulator (one emulator per test),
//! through the client-timed core; and what only this store has: its guarded writes (tests
//! that fail if the server or the store ignored a conflict), the nonce that makes every
//! write change the version, tokens that outlive a deleted entity, namespaces and kinds,
//! and refusals: reserved names, a server that ignores `baseVersion` (the Firestore
//! emulator's behaviour, played by a tiny fake), Firestore in Native mode, a 403.
//!
//! The emulator must be installed (see tests/servers/datastore_emulator.rs): without it
//! these tests fail, saying how to get it.

mod conformance;
mod servers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, TTL};
use leaderrun::store::client_timed::{Created, Record, Records, Version, Written};
use leaderrun::store::datastore::{open_with, DatastoreRecords, Target};
use leaderrun::store::google::{GoogleApi, Service};
use leaderrun::store::Access;
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
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

conformance_suite!(datastore());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = datastore().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

fn record(holder: &str, token: u64) -> Record {
    Record { holder: holder.into(), ttl_seconds: 30, token: Some(token), ..Record::default() }
}

/// What the store's safety rests on, one request at a time: each of these would be `Done`
/// if the insert's existence check, the transaction or the version comparison were ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_over_an_entity_and_a_stale_replace_are_refused() {
    let server = emulator().await;
    let (a, b) = (records(&server).await, records(&server).await);
    let lock = unique("guards");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    assert_eq!(b.create(&lock, &record("b", 2)).await.unwrap(), Created::Moved, "insert over an entity");
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    assert_ne!(first, second, "every write changes the version");
    assert_eq!(a.replace(&lock, &record("a", 3), &first).await.unwrap(), Written::Moved, "a stale version");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b", "the stale replace wrote nothing");
    // The current entity version with another nonce: another record at that version (as
    // after an emulator restart, which reuses versions). Refused.
    let (entity_version, _) = second.0.split_once(' ').unwrap();
    let lookalike = Version(format!("{entity_version} 12345"));
    assert_eq!(a.replace(&lock, &record("a", 3), &lookalike).await.unwrap(), Written::Moved, "the nonce is compared");
    // Deleted behind everyone's back: nothing to replace.
    delete(&server, &lock).await;
    assert_eq!(b.replace(&lock, &record("b", 4), &second).await.unwrap(), Written::Moved, "a deleted entity");
    assert!(a.read(&lock).await.unwrap().found.is_none());
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

/// Many replaces from one version at once: exactly one wins (the transaction and
/// `baseVersion`); if either were ignored, several would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_racing_replaces_and_creates_exactly_one_wins() {
    let server = emulator().await;
    for round in 0..3 {
        let lock = unique("race");
        let barrier = Arc::new(tokio::sync::Barrier::new(10));
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (records, lock, barrier) = (Arc::new(records(&server).await), lock.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let created = records.create(&lock, &record(&format!("c{i}"), 1)).await.unwrap();
                let version = records.read(&lock).await.unwrap().found.unwrap().version;
                barrier.wait().await;
                let replaced = records.replace(&lock, &record(&format!("r{i}"), 2), &version).await.unwrap();
                (created, replaced)
            }));
        }
        let (mut created, mut replaced) = (0, 0);
        for task in tasks {
            let (c, r) = task.await.unwrap();
            created += matches!(c, Created::Done { .. }) as usize;
            replaced += matches!(r, Written::Done(_)) as usize;
        }
        assert_eq!((created, replaced), (1, 1), "round {round}: exactly one create and one replace of ten");
    }
}

/// The token floor is the lookup's version, which Datastore never lowers, also for a
/// missing entity (the snapshot's version): a token taken after the entity was deleted is
/// still larger than every one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_outlive_a_deleted_entity() {
    let server = emulator().await;
    let store = open_url(&server.host(), &server.url(), Access::Create).await.unwrap();
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        for i in 0..3 {
            let lease = won(&*store, &lock, &format!("h{round}-{i}"), TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        delete(&server, &lock).await;
        assert_eq!(store.status(&lock).await.unwrap().token, 0, "the entity and its token are gone");
        // A create that lands now with a token from a read made before all of that (a slow
        // network, a paused host) is told a floor above every token handed out: the core
        // then raises its token before it counts.
        let late = records(&server).await.create(&lock, &record("late", 1)).await.unwrap();
        let Created::Done { floor, .. } = late else { panic!("a create on an empty name") };
        assert!(floor >= last, "round {round}: a late create's floor {floor} is below token {last}");
        delete(&server, &lock).await;
    }
}

/// Deleting a held lock's entity by hand is not a way to free it: a standby takes the lock at
/// once, while the holder learns only at its next renewal, so two children may run until then
/// (the store's page says so; `leaderrun release` is the way:
/// `revoked_holder_sees_it_at_the_next_renewal`). Shown here: the standby wins before the
/// holder has renewed, with a larger token, and that renewal then reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_the_entity_lets_a_standby_in_before_its_holder_learns() {
    let h = datastore().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("rm");
    let first = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    delete(&h.server, &lock).await;
    // The overlap: b holds it while a, which has not renewed since, still runs its child.
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token, "only the fencing token tells the two apart");
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the holder learns at its next renewal");
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

/// A one-shot run's first look at a held lock is not proof its holder lives; after one
/// observation without a change, the lock is taken (client-timed, on this host's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_holder_is_taken_over_after_one_observation() {
    let h = datastore().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("silent");
    let first = won(&*a, &lock, "a", Duration::from_secs(1)).await;
    let decide_in = match b.acquire(&lock, "b", TTL).await.unwrap() {
        Acquire::Unproven { decide_in, .. } => decide_in,
        other => panic!("a first sight is unproven: {other:?}"),
    };
    tokio::time::sleep(decide_in).await;
    let takeover = async {
        loop {
            match b.acquire(&lock, "b", TTL).await.unwrap() {
                Acquire::Won(lease) => return lease,
                _ => b.changed(&lock, Duration::from_secs(5)).await,
            }
        }
    };
    let second = tokio::time::timeout(conformance::SOON, takeover).await.expect("never taken over");
    assert!(second.token > first.token);
}

/// A tiny HTTP server that answers every request with `answer(path)`: (status, JSON body).
fn fake(answer: fn(&str) -> (u16, Value)) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let (mut request, mut line, mut length) = (String::new(), String::new(), 0usize);
                    if reader.read_line(&mut request).unwrap_or(0) == 0 {
                        return;
                    }
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let path = request.split_whitespace().nth(1).unwrap_or_default().to_string();
                    let (status, reply) = answer(&path);
                    let reply = reply.to_string();
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        reply.len()
                    );
                    if stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(reply.as_bytes())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    host
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
    let host = fake(|_| (200, json!({"mutationResults": [{"version": "1795425211452391"}]})));
    let err = refusal(&host, Access::Create).await;
    assert!(err.message.contains("ignores baseVersion") && err.message.contains("Firestore emulator"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn firestore_in_native_mode_is_refused_by_name() {
    let host = fake(|_| {
        let message = "The Cloud Datastore API is not available for Firestore in Native mode database \
                       projects/careless-project/databases/(default).";
        (400, json!({"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION"}}))
    });
    let err = refusal(&host, Access::Existing).await;
    assert!(err.message.contains("Firestore in Native mode") && err.message.contains("Datastore mode"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permission_denied_is_refused_in_one_line() {
    let host = fake(|path| {
        assert!(path.starts_with("/v1/projects/careless-project:"), "{path}");
        let message = "Missing or insufficient permissions.";
        (403, json!({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}}))
    });
    for access in [Access::Create, Access::Existing] {
        let err = refusal(&host, access).await;
        assert!(err.message.contains("HTTP 403 PERMISSION_DENIED: Missing or insufficient"), "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_an_outage() {
    let host = format!("127.0.0.1:{}", servers::free_port());
    let target = Target::parse("datastore://some-project").unwrap();
    let err = open_with(&target, Access::Create, api(&host)).await.err().expect("nothing listens");
    assert!(err.is_transient(), "{}", err.message);
    assert!(err.message.contains("datastore://some-project") && !err.message.contains('\n'), "{:?}", err.message);
}

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&datastore().await, &requests).await;
}
