//! The conformance suite against fake-gcs-server (one server per test), through the
//! client-timed core; and what only this store has: its preconditions (tests that fail if
//! a server ignored them), tokens that outlive a deleted object, object names, a missing
//! bucket refused, and the check that refuses a server which ignores preconditions.
//!
//! `leases_survive_a_restart` runs for real: the server keeps its objects on disk (but see
//! `awkward_lock_names` below).

mod conformance;
mod servers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, TTL};
use leaderrun::store::client_timed::{Created, Record, Records, Written};
use leaderrun::store::gcs::{open_with, GcsRecords, Target};
use leaderrun::store::google::{GoogleApi, Service};
use leaderrun::store::Access;
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use servers::fake_gcs::FakeGcs;

struct GcsHarness {
    server: FakeGcs,
}

async fn gcs() -> GcsHarness {
    GcsHarness { server: tokio::task::spawn_blocking(FakeGcs::start).await.unwrap() }
}

async fn gcs_in_memory() -> GcsHarness {
    GcsHarness { server: tokio::task::spawn_blocking(FakeGcs::start_in_memory).await.unwrap() }
}

/// The emulator at `endpoint`, named in code: in-process clients cannot each have an
/// environment of their own (the end-to-end tests set STORAGE_EMULATOR_HOST instead).
fn api(endpoint: &str) -> GoogleApi {
    GoogleApi::emulator(Service::Storage, endpoint).unwrap()
}

async fn open_url(server: &FakeGcs, url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid URL");
    open_with(&target, access, api(&server.endpoint())).await.map(Arc::from)
}

async fn records(server: &FakeGcs) -> GcsRecords {
    let target = Target::parse(&server.url()).unwrap();
    GcsRecords::open_with(&target, Access::Create, api(&server.endpoint())).await.unwrap()
}

#[async_trait]
impl Harness for GcsHarness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server, &self.server.url(), Access::Create).await.expect("open the gcs store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

// Every test of the suite but `awkward_lock_names` against the server that keeps its
// objects on disk (so restarts keep them)...
conformance_suite!(@tests (flavor = "multi_thread", worker_threads = 4) gcs();
    exclusive_acquire_with_50_contenders,
    renew_by_the_holder_only,
    expiry_frees_the_lock,
    release_frees_the_lock_at_once,
    release_with_keep_holds_until_then,
    revoke_frees_a_min_hold_keep_at_once,
    abandon_frees_only_this_identitys_lease,
    tokens_strictly_increase,
    status_list_and_revoke_agree,
    revoked_holder_sees_it_at_the_next_renewal,
    a_release_wakes_a_waiter,
    slots_are_locks_of_their_own,
    a_standby_that_stops_waiting_holds_no_one_up,
    leases_survive_a_restart,
);
// ...and that one against a server that keeps them in memory: on disk, each object is one
// file, whose name cannot be longer than 255 bytes, while Cloud Storage takes names up to
// 1,024 (the suite's longest lock name is 510 bytes).
conformance_suite!(@tests (flavor = "multi_thread", worker_threads = 4) gcs_in_memory();
    awkward_lock_names,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = gcs().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

fn record(holder: &str, token: u64) -> Record {
    Record { holder: holder.into(), ttl_seconds: 30, token: Some(token), ..Record::default() }
}

/// What the store's safety rests on, one request at a time: each of these would be
/// `Done` on a server that ignored ifGenerationMatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_over_an_object_and_a_stale_replace_are_refused() {
    let server = tokio::task::spawn_blocking(FakeGcs::start).await.unwrap();
    let (a, b) = (records(&server).await, records(&server).await);
    let lock = unique("preconditions");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    assert_eq!(b.create(&lock, &record("b", 2)).await.unwrap(), Created::Moved, "ifGenerationMatch=0 ignored");
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    assert_ne!(first, second, "every write changes the version");
    assert_eq!(a.replace(&lock, &record("a", 3), &first).await.unwrap(), Written::Moved, "a stale generation ignored");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b", "the stale replace wrote nothing");
    // The same record written again still changes the version (a new generation).
    let Written::Done(third) = b.replace(&lock, &record("b", 2), &second).await.unwrap() else { panic!("rewrite") };
    assert_ne!(second, third, "the same record written twice must change the version");
    // Deleted behind everyone's back: a replace finds nothing to replace.
    server.delete(&format!("leaderrun/{lock}"));
    assert_eq!(
        b.replace(&lock, &record("b", 4), &third).await.unwrap(),
        Written::Moved,
        "a replace of a deleted object"
    );
    assert!(a.read(&lock).await.unwrap().found.is_none());
}

/// Ten writes at once, each by its own client, after a barrier: how many were written.
async fn race<F, Fut>(clients: &[Arc<GcsRecords>], write: F) -> Vec<leaderrun::store::client_timed::Version>
where
    F: Fn(Arc<GcsRecords>, usize) -> Fut,
    Fut: std::future::Future<Output = Written> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let (barrier, write) = (barrier.clone(), write(client.clone(), i));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            write.await
        }));
    }
    let mut done = Vec::new();
    for task in tasks {
        if let Written::Done(version) = task.await.unwrap() {
            done.push(version);
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_racing_creates_and_replaces_exactly_one_wins() {
    let server = tokio::task::spawn_blocking(FakeGcs::start).await.unwrap();
    let lock = unique("race");
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(Arc::new(records(&server).await));
    }
    let created = race(&clients, |c, i| {
        let lock = lock.clone();
        async move {
            match c.create(&lock, &record(&format!("c{i}"), 1)).await.unwrap() {
                Created::Done { version, .. } => Written::Done(version),
                Created::Moved => Written::Moved,
            }
        }
    })
    .await;
    assert_eq!(created.len(), 1, "exactly one create of ten may succeed");
    let replaced = race(&clients, |c, i| {
        let (lock, base) = (lock.clone(), created[0].clone());
        async move { c.replace(&lock, &record(&format!("r{i}"), 2), &base).await.unwrap() }
    })
    .await;
    assert_eq!(replaced.len(), 1, "exactly one replace of ten at one version may succeed");
}

/// Cloud Storage keeps no counter beyond an object's life (and its generations need not
/// increase): tokens follow the server's clock, so one taken after the object was deleted
/// (even within the same second) is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_outlive_a_deleted_object() {
    let server = tokio::task::spawn_blocking(FakeGcs::start).await.unwrap();
    let store = open_url(&server, &server.url(), Access::Create).await.unwrap();
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        for i in 0..5 {
            let lease = won(&*store, &lock, &format!("h{round}-{i}"), TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        server.delete(&format!("leaderrun/{lock}"));
        assert_eq!(store.status(&lock).await.unwrap().token, 0, "the object and its token are gone");
        // A create that lands now with a token from a read made before all of that (a slow
        // network, a paused host) is told a floor above every token handed out: the core
        // then raises its token before it counts.
        let late = records(&server).await.create(&lock, &record("late", 1)).await.unwrap();
        let Created::Done { floor, .. } = late else { panic!("a create on an empty name") };
        assert!(floor >= last, "round {round}: a late create's floor {floor} is below token {last}");
        server.delete(&format!("leaderrun/{lock}"));
    }
}

/// Deleting a held lock's object by hand is not a way to free it: a standby takes the lock at
/// once, while the holder learns only at its next renewal, so two children may run until then
/// (the store's page says so; `leaderrun release` is the way:
/// `revoked_holder_sees_it_at_the_next_renewal`). Shown here: the standby wins before the
/// holder has renewed, with a larger token, and that renewal then reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_the_object_lets_a_standby_in_before_its_holder_learns() {
    let h = gcs().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("rm");
    let first = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    h.server.delete(&format!("leaderrun/{lock}"));
    // The overlap: b holds it while a, which has not renewed since, still runs its child.
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token, "only the fencing token tells the two apart");
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the holder learns at its next renewal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_sit_under_the_prefix_and_list_shows_only_locks() {
    let h = gcs().await;
    let store = open_url(&h.server, &format!("{}/team/b", h.server.url()), Access::Create).await.unwrap();
    let lock = format!("a/b %.{}", unique("key"));
    won(&*store, &lock, "a", TTL).await;
    // Someone else's objects under the prefix are not locks, and do not break the list.
    for name in ["team/b/notes.txt", "team/b/sub/x"] {
        h.server.put(name, "hello");
    }
    let names = h.server.names("team/b/");
    let expected = format!("team/b/{}", lock.replace('%', "%25").replace('/', "%2F"));
    assert!(names.contains(&expected), "{names:?}");
    assert!(names.contains(&"team/b/.conditional-write-probe".to_string()), "{names:?}");
    let listed: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    assert_eq!(listed, vec![lock.clone()]);
    // The default prefix is another set of locks.
    let other = h.open().await;
    won(&*other, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_bucket_is_refused() {
    let server = tokio::task::spawn_blocking(FakeGcs::start).await.unwrap();
    for access in [Access::Create, Access::Existing] {
        let err = open_url(&server, "gs://no-such-bucket", access).await.err().expect("refused");
        assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
        assert!(
            err.message.contains("gs://no-such-bucket") && err.message.contains("bucket does not exist"),
            "{}",
            err.message
        );
        assert!(!err.message.contains('\n'), "{:?}", err.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_an_outage() {
    let port = servers::free_port();
    let target = Target::parse("gs://some-bucket").unwrap();
    let err =
        open_with(&target, Access::Create, api(&format!("127.0.0.1:{port}"))).await.err().expect("nothing listens");
    assert!(err.is_transient(), "{}", err.message);
    assert!(err.message.contains("gs://some-bucket") && !err.message.contains('\n'), "{:?}", err.message);
}

/// A tiny HTTP server that answers every request with `status` and `body` (an object
/// resource), whatever it asks: preconditions ignored, or permission refused.
fn answering(status: &'static str, body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let (mut line, mut length) = (String::new(), 0usize);
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        line.clear();
                    }
                    if line != "\r\n" {
                        return;
                    }
                    let mut request = vec![0; length];
                    if reader.read_exact(&mut request).is_err() {
                        return;
                    }
                    let reply = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    endpoint
}

/// A server that answers every upload with 200, preconditions or not: two hosts could both
/// "create" a lock. It is refused when a run opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_preconditions_is_refused_at_open() {
    let endpoint =
        answering("200 OK", r#"{"name":"leaderrun/.conditional-write-probe","generation":"1","metageneration":"1"}"#);
    let target = Target::parse("gs://careless-bucket").unwrap();
    let err = open_with(&target, Access::Create, api(&endpoint))
        .await
        .err()
        .expect("a server that ignores ifGenerationMatch must be refused");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("ignores ifGenerationMatch") && !err.message.contains('\n'), "{:?}", err.message);
}

/// A 403 is a refusal in one line that names the bucket, the call and the permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permission_refused_is_a_refusal_naming_the_bucket_and_operation() {
    let endpoint = answering(
        "403 Forbidden",
        r#"{"error":{"code":403,"message":"someone@example.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud Storage object."}}"#,
    );
    let target = Target::parse("gs://locked-bucket").unwrap();
    let err = open_with(&target, Access::Create, api(&endpoint)).await.err().expect("refused");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    for needle in ["gs://locked-bucket", "objects.insert", "403", "permissions storage.objects.create and"] {
        assert!(err.message.contains(needle), "{needle}: {}", err.message);
    }
    assert!(!err.message.contains('\n'), "{:?}", err.message);
    let err = open_with(&target, Access::Existing, api(&endpoint)).await.err().expect("refused");
    assert!(
        err.message.contains("objects.list") && err.message.contains("permission storage.objects.list"),
        "{}",
        err.message
    );
}

/// A one-shot run's first look at a held lock is not proof its holder lives; after one
/// observation without a change, the lock is taken (client-timed, on this host's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_holder_is_taken_over_after_one_observation() {
    let h = gcs().await;
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

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&gcs().await, &requests).await;
}
