//! The conformance suite and the client-timed stores' suite (tests/client_timed/: its
//! preconditions, racing writes, tokens that outlive a deleted object, a deletion's overlap)
//! against fake-gcs-server (one server per test); and what only this store has: object
//! names, a missing bucket refused, a 403 named, and the check that refuses a server which
//! ignores preconditions.
//!
//! `leases_survive_a_restart` runs for real: the server keeps its objects on disk (but see
//! `awkward_lock_names` below).

mod client_timed;
mod conformance;
mod servers;

use std::sync::Arc;

use async_trait::async_trait;
use client_timed::{fake_http, RecordsHarness, Reply};
use conformance::{unique, won, Harness, TTL};
use leaderrun::store::gcs::{open_with, GcsRecords, Target};
use leaderrun::store::google::{GoogleApi, Service};
use leaderrun::store::Access;
use leaderrun::store::{ErrorKind, Store, StoreError};
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

#[async_trait]
impl RecordsHarness for GcsHarness {
    type Records = GcsRecords;
    type Server = FakeGcs;

    async fn records(&self) -> GcsRecords {
        records(&self.server).await
    }

    async fn delete(&self, lock: &str) {
        self.server.delete(&format!("leaderrun/{lock}"));
    }

    fn server(&self) -> &FakeGcs {
        &self.server
    }

    async fn open_unreachable(port: u16) -> (String, Result<Box<dyn Store>, StoreError>) {
        let target = Target::parse("gs://some-bucket").unwrap();
        ("gs://some-bucket".into(), open_with(&target, Access::Create, api(&format!("127.0.0.1:{port}"))).await)
    }
}

client_timed_suite!(GcsHarness, gcs());

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

/// A server that answers every upload with 200, preconditions or not: two hosts could both
/// "create" a lock. It is refused when a run opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_preconditions_is_refused_at_open() {
    let endpoint = fake_http(|_| {
        let object = r#"{"name":"leaderrun/.conditional-write-probe","generation":"1","metageneration":"1"}"#;
        Reply::json("200 OK", "application/json", object)
    });
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
    let endpoint = fake_http(|_| {
        let error = r#"{"error":{"code":403,"message":"someone@example.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud Storage object."}}"#;
        Reply::json("403 Forbidden", "application/json", error)
    });
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
