//! The conformance suite against the test Kubernetes API server (one per test), through
//! the client-timed core, and what only this store has: Leases that kubectl deletes or
//! peers wrote, metadata peers put on a Lease, refusals without the token, a watch from a
//! forgotten resourceVersion, and what each call costs in requests.

mod conformance;
mod servers;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance::{count_requests, held, unique, won, Harness, SOON, TTL};
use leaderrun::store::kind::StoreSpec;
use leaderrun::store::kubernetes::Target;
use leaderrun::store::Access;
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use servers::kubernetes::KubeApiServer;

struct Kube {
    server: KubeApiServer,
}

async fn kube() -> Kube {
    Kube { server: tokio::task::spawn_blocking(KubeApiServer::start).await.unwrap() }
}

/// The store `url` names, with this kubeconfig (each test has its own server, and the
/// tests of one process share one environment, so not through $KUBECONFIG).
async fn open_with(url: &str, kubeconfig: &Path) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid k8s:// URL").with_kubeconfig(kubeconfig);
    target.open(Access::Create).await.map(Arc::from)
}

#[async_trait]
impl Harness for Kube {
    async fn open(&self) -> Arc<dyn Store> {
        open_with("k8s://", &self.server.kubeconfig()).await.expect("open the kubernetes store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(kube());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = kube().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

/// Write a Lease as another client would, through kubectl.
fn kubectl_create(server: &KubeApiServer, name: &str, spec: &str) {
    let file = server.dir().join(format!("{name}.json"));
    let lease = format!(
        r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"{name}"}},"spec":{spec}}}"#
    );
    std::fs::write(&file, lease).unwrap();
    server.kubectl_ok(&["create", "--validate=false", "-f", file.to_str().unwrap()]);
}

/// `kubectl delete lease` frees the lock at once for everyone else, while the holder learns it
/// only at its next renewal (an overlap the store's page warns of: `leaderrun release` is the
/// way to make a holder stand down); that renewal must not bring the Lease back (its uid no
/// longer matches); the next token is still larger than the deleted Lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_kubectl_deleted_stays_deleted_and_tokens_still_grow() {
    let h = kube().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("deleted");
    let lease = won(&*a, &lock, "a", TTL).await;
    h.server.kubectl_ok(&["delete", "lease", &lock]);
    assert!(matches!(a.renew(&lease, TTL).await.unwrap(), Renew::Lost(_)), "the deleted holder renewed");
    let gone = h.server.kubectl(&["get", "lease", &lock]);
    assert!(!gone.status.success(), "the renewal re-created the Lease: {}", String::from_utf8_lossy(&gone.stdout));
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token, "{} after {}", next.token, lease.token);
    a.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(b.status(&lock).await.unwrap().holder.as_deref(), Some("b"), "the old lease's release is a no-op");
}

/// A Lease a client-go elector holds: first sight is unproven; unchanged for a whole
/// observation, it is taken, with a token above every resourceVersion before. One it
/// released (holderIdentity "") is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_other_clients_wrote() {
    let h = kube().await;
    let store = h.open().await;
    kubectl_create(&h.server, "by-client-go", r#"{"holderIdentity":"pod-1","leaseDurationSeconds":1}"#);
    let first = store.acquire("by-client-go", "a", TTL).await.unwrap();
    assert!(matches!(first, Acquire::Unproven { .. }), "{first:?}");
    let started = Instant::now();
    let lease = loop {
        match store.acquire("by-client-go", "a", TTL).await.unwrap() {
            Acquire::Won(lease) => break lease,
            other => assert!(started.elapsed() < SOON, "a dead client-go holder was never replaced: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(lease.token >= 1);
    let after = h.server.kubectl_ok(&["get", "lease", "by-client-go", "-o", "jsonpath={.spec.leaseTransitions}"]);
    assert_eq!(after, "1", "a new holder is a transition");

    kubectl_create(&h.server, "released", r#"{"holderIdentity":"","leaseDurationSeconds":1}"#);
    let released = won(&*store, "released", "a", TTL).await;
    assert!(released.token > lease.token);
}

/// Labels and annotations a peer put on the Lease survive leaderrun's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peers_metadata_survives() {
    let h = kube().await;
    let store = h.open().await;
    let lock = unique("metadata");
    let lease = won(&*store, &lock, "a", TTL).await;
    h.server.kubectl_ok(&["label", "lease", &lock, "team=billing"]);
    h.server.kubectl_ok(&["annotate", "lease", &lock, "example.com/owner=ops"]);
    // The renewal's cached version is stale now: it re-reads, then writes.
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    store.release(&lease, Duration::ZERO).await.unwrap();
    let meta =
        h.server.kubectl_ok(&["get", "lease", &lock, "-o", "jsonpath={.metadata.labels.team} {.metadata.annotations}"]);
    assert!(meta.starts_with("billing ") && meta.contains("example.com/owner"), "{meta}");
    let holder = h.server.kubectl_ok(&["get", "lease", &lock, "-o", "jsonpath=[{.spec.holderIdentity}]"]);
    assert_eq!(holder, "[]", "released as client-go releases");
}

/// A lock name that is not an object name is hashed, and listed by its own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn awkward_names_become_hashed_lease_names() {
    let h = kube().await;
    let store = h.open().await;
    let lock = format!("Nightly Report/{}", unique("x"));
    won(&*store, &lock, "a", TTL).await;
    let names = h.server.kubectl_ok(&["get", "leases", "-o", "jsonpath={.items[*].metadata.name}"]);
    assert!(names.starts_with("leaderrun-sha256-") && names.len() == 81, "{names}");
    let listed = store.list().await.unwrap();
    assert_eq!(listed.iter().map(|r| r.lock.as_str()).collect::<Vec<_>>(), vec![lock.as_str()]);
}

/// 401 and 403 are refusals, in one line, naming what RBAC denied, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_say_what_was_denied_without_the_token() {
    let h = kube().await;
    let check = |err: StoreError, needles: &[&str]| {
        assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
        for needle in needles {
            assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        }
        for secret in [h.server.token(), h.server.denied_token(), "wrong-token-5ecr3t"] {
            assert!(!err.message.contains(secret), "a token in {:?}", err.message);
        }
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let denied = open_with("k8s://", &h.server.denied_kubeconfig()).await.expect("opening asks nothing yet");
    check(denied.status("x").await.unwrap_err(), &["RBAC denies get", "leases", "403", "leaderrun-test"]);
    check(denied.acquire("x", "a", TTL).await.unwrap_err(), &["RBAC denies get"]);
    check(denied.list().await.unwrap_err(), &["RBAC denies list"]);
    let wrong = open_with("k8s://elsewhere", &h.server.wrong_kubeconfig()).await.unwrap();
    check(wrong.status("x").await.unwrap_err(), &["401", "credentials", "namespace elsewhere"]);
    // A missing kubeconfig, or a context it lacks: refused before any request.
    let err = open_with("k8s://", &h.server.dir().join("nonexistent")).await.err().expect("no kubeconfig");
    check(err, &["kubeconfig"]);
    let err = open_with("k8s://?context=nope", &h.server.kubeconfig()).await.err().expect("no such context");
    check(err, &["kubeconfig", "nope"]);
    // A server that is down: transient.
    let store = h.open().await;
    h.server.stop();
    let err = store.status("x").await.unwrap_err();
    assert!(err.is_transient(), "{}", err.message);
}

/// A wait from a resourceVersion the server no longer keeps history for (410 Gone inside
/// the watch stream) lists the Lease afresh and watches on from there: it still hears the
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_from_a_forgotten_version_still_hears_the_release() {
    let server = tokio::task::spawn_blocking(|| KubeApiServer::start_with_history(3)).await.unwrap();
    let h = Kube { server };
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("gone");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await; // b has seen the Lease's version
    for i in 0..5 {
        won(&*a, &unique(&format!("other-{i}")), "a", TTL).await;
    }
    let lists = h.server.requests("list");
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move { b.changed(&lock, Duration::from_secs(3600)).await })
    };
    let started = Instant::now();
    while h.server.requests("list") == lists {
        assert!(started.elapsed() < SOON, "the 410 never made the watch list the Lease afresh");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, waiter).await.expect("the release never woke the waiter").unwrap();
    won(&*b, &lock, "b", TTL).await;
}

/// `leaderrun watch` keeps one watch on the Lease: it sees every write (renewals too: the
/// Lease's renewTime), asks nothing while nothing changes, and never writes.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = count_requests();
    let h = kube().await;
    conformance::a_watcher_sees_changes_and_takes_no_turn(&h, &requests).await;
}

/// What a call costs: a renewal is one PUT; taking a free lock that has a Lease is a GET
/// and a PUT; a lock with no Lease is a GET, a LIST (for the token floor) and a POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_per_call() {
    let h = kube().await;
    let store = h.open().await;
    let count = || ["get", "list", "create", "update", "watch"].map(|verb| h.server.requests(verb));
    let lock = unique("cost");
    let before = count();
    let lease = won(&*store, &lock, "a", TTL).await;
    let after_acquire = count();
    assert_eq!(diff(before, after_acquire), [1, 1, 1, 0, 0], "get, list, create");
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    let after_renew = count();
    assert_eq!(diff(after_acquire, after_renew), [0, 0, 0, 1, 0], "one update");
    store.release(&lease, Duration::ZERO).await.unwrap();
    let after_release = count();
    won(&*store, &lock, "b", TTL).await;
    assert_eq!(diff(after_release, count()), [1, 0, 0, 1, 0], "get, update");
}

fn diff(before: [u64; 5], after: [u64; 5]) -> [u64; 5] {
    std::array::from_fn(|i| after[i] - before[i])
}

/// A server that stops answering (SIGSTOP: connections stay open, nothing comes back):
/// calls fail as transient within the store's request bound, and work again once it
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_server_is_a_transient_error() {
    let h = kube().await;
    let store = h.open().await;
    let lock = unique("frozen");
    let lease = won(&*store, &lock, "a", TTL).await;
    h.server.freeze();
    let answer = tokio::time::timeout(SOON, store.renew(&lease, TTL)).await;
    h.server.thaw();
    let err = answer.expect("a call to a frozen server must end").expect_err("no answer is no renewal");
    assert!(err.is_transient() && err.message.contains("no answer"), "{}", err.message);
    let started = Instant::now();
    while store.renew(&lease, TTL).await.is_err() {
        assert!(started.elapsed() < SOON, "the thawed server never answered");
    }
}

/// A standby waiting for a held lock keeps one watch open and reads nothing while the
/// holder renews: each renewal reaches it on the watch. Only the release makes it read
/// (a free record is read afresh before it is written over).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_standby_asks_nothing_but_its_watch() {
    let h = kube().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("idle");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    let (gets, watches) = (h.server.requests("get"), h.server.requests("watch"));
    let standby = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                b.changed(&lock, Duration::from_secs(3600)).await;
                if let Acquire::Won(lease) = b.acquire(&lock, "b", TTL).await.unwrap() {
                    return lease;
                }
                assert!(started.elapsed() < SOON * 2, "b never took over");
            }
        })
    };
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    }
    a.release(&lease, Duration::ZERO).await.unwrap();
    let next = tokio::time::timeout(SOON, standby).await.expect("the release never woke b").unwrap();
    assert!(next.token > lease.token);
    // a's release read the Lease once; b read it once, when it saw it released.
    let (gets, watches) = (h.server.requests("get") - gets, h.server.requests("watch") - watches);
    assert!(gets <= 2, "{gets} reads while waiting through 5 renewals");
    assert_eq!(watches, 1, "one watch, kept open");
}

/// A kubeconfig whose user runs an exec credential plugin (as EKS, GKE and AKS logins do):
/// the plugin's token is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exec_credential_plugin_supplies_the_token() {
    let h = kube().await;
    let credential = format!(
        r#"{{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{{"token":"{}"}}}}"#,
        h.server.token()
    );
    let plugin = h.server.dir().join("credential-plugin.sh");
    std::fs::write(&plugin, format!("#!/bin/sh\necho '{credential}'\n")).unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let exec = format!(
        "exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: {}\n      \
         interactiveMode: Never",
        plugin.display()
    );
    let text = std::fs::read_to_string(h.server.kubeconfig()).unwrap();
    let with_exec = text.replace(&format!("token: {}", h.server.token()), &exec);
    assert_ne!(text, with_exec, "the kubeconfig names the user's token");
    let kubeconfig = h.server.dir().join("exec.kubeconfig");
    std::fs::write(&kubeconfig, with_exec).unwrap();

    let store = open_with("k8s://", &kubeconfig).await.expect("open with the exec plugin");
    let lock = unique("exec");
    won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
}
