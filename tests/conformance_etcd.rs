//! The conformance suite against a real etcd server (one per test, started in a temporary
//! directory), and what only this store has: error kinds and messages without the
//! password, and the key prefix in the URL.

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{count_requests, held, unique, won, Harness, TTL};
use leaderrun::store::{registry, Access};
use leaderrun::store::{ErrorKind, Renew, Store, StoreError};
use servers::etcd::Etcd;

struct EtcdHarness {
    server: Etcd,
}

async fn etcd() -> EtcdHarness {
    EtcdHarness { server: tokio::task::spawn_blocking(Etcd::start).await.unwrap() }
}

async fn open_url(url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    registry::parse_url(url).expect("a valid URL").open(access).await.map(Arc::from)
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.url(), Access::Create).await.expect("open the etcd store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(etcd());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = etcd().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_prefix_separates_users_of_one_cluster() {
    let h = etcd().await;
    let (default, other) =
        (h.open().await, open_url(&format!("{}/team-b", h.server.url()), Access::Create).await.unwrap());
    let lock = unique("shared-name");
    let a = won(&*default, &lock, "a", TTL).await;
    let b = won(&*other, &lock, "b", TTL).await;
    assert!(b.token > a.token, "revisions are global to the cluster");
    held(&*other, &lock, "c").await;
    let keys = h.server.etcdctl(&["get", "--prefix", "--keys-only", "/"]);
    assert!(
        keys.contains(&format!("/leaderrun/lock/{lock}")) && keys.contains(&format!("/team-b/lock/{lock}")),
        "{keys}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_went_wrong_without_the_password() {
    let h = etcd().await;
    let check = |err: StoreError, kind: ErrorKind, needle: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    // Authentication: a root user and a limited user with a password.
    h.server.enable_auth("app", "hunter2", "/leaderrun/");
    let port = h.server.port();

    let right = format!("etcd://app:hunter2@127.0.0.1:{port}");
    let store = open_url(&right, Access::Create).await.expect("the right password");
    let lock = unique("auth");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    store.release(&lease, Duration::ZERO).await.unwrap();

    let wrong = format!("etcd://app:hunter2x@127.0.0.1:{port}");
    check(open_url(&wrong, Access::Create).await.err().unwrap(), ErrorKind::Refused, "app:***@");
    // Opening reads nothing: a prefix outside the user's permissions is refused at the first call.
    let outside = format!("etcd://app:hunter2@127.0.0.1:{port}/elsewhere");
    let elsewhere = open_url(&outside, Access::Create).await.expect("the right password");
    check(elsewhere.acquire("x", "a", TTL).await.err().unwrap(), ErrorKind::Refused, "permission denied");
    check(elsewhere.status("x").await.err().unwrap(), ErrorKind::Refused, "permission denied");
    let closed = format!("etcd://app:hunter2@127.0.0.1:{}", servers::free_port());
    check(open_url(&closed, Access::Create).await.err().unwrap(), ErrorKind::Unavailable, "***");
    // A bad URL is bad usage, found while the command line is checked: one line, no password.
    for (url, needle) in [
        (format!("etcd://app:hunter2@127.0.0.1:{port}?cacert=/ca.pem"), "need TLS"),
        (format!("etcd://app:hunter2@127.0.0.1:{port}?cacrt=/ca.pem"), "unknown parameter ?cacrt="),
    ] {
        let why = registry::parse_url(&url).expect_err("refused while parsing");
        assert!(why.contains(needle) && why.contains("app:***@") && !why.contains("hunter2"), "{why}");
    }

    // A server that goes away under an open client: transient.
    h.server.stop();
    let err = store.status("x").await.expect_err("the server is down");
    check(err, ErrorKind::Unavailable, &format!(":{port}"));
}

/// etcd forgets an authentication token left unused for its --auth-token-ttl (and a restarted
/// member forgets them all): a client whose token lapsed gets a new one and carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_auth_token_is_replaced() {
    let server = tokio::task::spawn_blocking(|| Etcd::start_with_auth_token_ttl(1)).await.unwrap();
    server.enable_auth("app", "hunter2", "/leaderrun/");
    let url = format!("etcd://app:hunter2@127.0.0.1:{}", server.port());
    let (a, b) = (open_url(&url, Access::Create).await.unwrap(), open_url(&url, Access::Create).await.unwrap());
    let lock = unique("token");
    let lease = won(&*a, &lock, "a", TTL).await;
    // Long enough unused for etcd (which looks once a second) to forget both tokens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move { b.changed(&lock, Duration::from_secs(3600)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the release never woke b").unwrap();
    won(&*b, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_with_the_servers_ca() {
    let server = tokio::task::spawn_blocking(Etcd::start_tls).await.unwrap();
    let store = open_url(&server.tls_url(), Access::Create).await.expect("open over TLS with a client certificate");
    let lock = unique("tls");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    // The same lock seen over the plain port: one cluster, one lease.
    let plain = open_url(&server.url(), Access::Create).await.unwrap();
    assert_eq!(plain.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
    held(&*plain, &lock, "b").await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    won(&*plain, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_errors_say_what_went_wrong() {
    let server = tokio::task::spawn_blocking(Etcd::start_tls).await.unwrap();
    let check = |err: StoreError, kind: ErrorKind, needle: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let url = server.tls_url();
    let base = url.split_once('?').unwrap().0.to_string();
    let ca = server.certs().ca().display().to_string();
    // Opening connects to nothing: the first call finds out.
    let first_call = |url: String| async move {
        let store = open_url(&url, Access::Create).await.expect("opening sends nothing");
        store.status("x").await.expect_err("the handshake fails")
    };
    // The system's CAs do not know the test CA.
    check(first_call(base.clone()).await, ErrorKind::Refused, "certificate");
    // The server asks for a client certificate and none is shown. Under TLS 1.3 the server's
    // refusal comes after the handshake and reaches the client as a bare transport error.
    let err = first_call(format!("{base}?cacert={ca}")).await;
    assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    check(
        open_url(&format!("{base}?cacert=/nonexistent/ca.pem"), Access::Create).await.err().unwrap(),
        ErrorKind::Refused,
        "cacert=/nonexistent",
    );
}

/// A waiting standby keeps its queue entry and one watch stream across `changed` calls. The
/// first wait sets them up: a lease for the entry, one transaction (the entry, and the lock
/// key and the queue read at one revision) and a stream with two watchers (the lock key and
/// the queue) from the next revision. Then nothing is sent while the lock stays held, and a
/// release still wakes the standby.
#[tokio::test]
async fn an_idle_standby_keeps_one_watch_and_sends_nothing() {
    let (requests, _counting) = count_requests();
    let h = etcd().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("idle");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    let before = requests.count();
    b.changed(&lock, Duration::from_millis(200)).await;
    assert_eq!(requests.count() - before, 4, "the first wait joins the queue and opens the watch");
    let before = requests.count();
    for _ in 0..5 {
        b.changed(&lock, Duration::from_millis(200)).await;
    }
    assert_eq!(requests.count() - before, 0, "an idle standby sends nothing");
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the release wakes the standby");
    let before = requests.count();
    won(&*b, &lock, "b", TTL).await;
    assert_eq!(requests.count() - before, 2, "after a wake-up: grant and write, no read first");
}

/// A holder that dies without releasing (its process killed: nothing renews its etcd lease):
/// the standby's kept watch sees etcd delete the key at expiry, and the standby takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_when_a_dead_holders_lease_expires() {
    let h = etcd().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("dead-holder");
    let first = won(&*a, &lock, "a", Duration::from_secs(2)).await;
    drop(a);
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_millis(100)).await;
    tokio::time::timeout(conformance::SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the expiry wakes the standby");
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token);
}

/// A one-shot run on a free lock: grant, write, revoke; nothing read first, nothing at open.
#[tokio::test]
async fn a_one_shot_run_takes_three_requests() {
    let (requests, _counting) = count_requests();
    let h = etcd().await;
    let store = h.open().await;
    assert_eq!(requests.count(), 0, "opening sends nothing");
    let lease = won(&*store, &unique("one-shot"), "a", TTL).await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(requests.count(), 3);
}

#[tokio::test]
async fn an_idle_standby_sends_nothing() {
    let (requests, _counting) = count_requests();
    conformance::an_idle_standby_sends_nothing(&etcd().await, &requests).await;
}

/// `leaderrun watch` keeps one watch on the lock key: it sees every change (expiry too, as
/// etcd deletes the key), asks nothing while nothing changes, and takes no place in the queue.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = count_requests();
    let h = etcd().await;
    conformance::a_watcher_sees_changes_and_takes_no_turn(&h, &requests).await;
}

/// The waiters queue: a release wakes the first one, and the others wake only if it lets its
/// turn pass, so a handoff costs a few requests however many wait (about 100 with a herd).
#[tokio::test]
async fn a_hundred_waiters_each_get_their_turn_once() {
    let (requests, _counting) = count_requests();
    // About 4 on a quiet machine (BENCHMARKS.md 2b); a waiter slowed past its stagger lets the
    // next in line try too, so a loaded machine has measured 10.2. A herd would be about 100.
    conformance::a_hundred_waiters_take_turns(&etcd().await, &requests, 2.0..20.0).await;
}

/// The keys of one lock's queue entries, as etcdctl lists them.
fn queue_entries(h: &EtcdHarness, lock: &str) -> Vec<String> {
    let keys = h.server.etcdctl(&["get", "--prefix", "--keys-only", &format!("/leaderrun/queue/{lock}/")]);
    keys.lines().filter(|line| !line.trim().is_empty()).map(str::to_string).collect()
}

/// Wait until the lock's queue has `n` entries.
async fn until_queued(h: &EtcdHarness, lock: &str, n: usize) {
    let started = std::time::Instant::now();
    while queue_entries(h, lock).len() != n {
        assert!(started.elapsed() < conformance::SOON, "the queue never had {n} entries: {:?}", queue_entries(h, lock));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A waiter that vanishes without a word (its process SIGKILLed: no cleanup, and its queue
/// entry stays, on a lease nobody renews) does not stall the waiter behind it until the entry
/// lapses: a release wakes that one a stagger later, and its win clears both entries. Queue
/// entries are not locks: `list` does not show them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vanished_waiter_does_not_stall_the_one_behind_it() {
    let h = etcd().await;
    let (a, gone, b) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("vanished");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*gone, &lock, "gone").await;
    let killed = {
        let (gone, lock) = (gone.clone(), lock.clone());
        tokio::spawn(async move { gone.changed(&lock, Duration::from_secs(3600)).await })
    };
    until_queued(&h, &lock, 1).await;
    killed.abort();
    let _ = killed.await;
    drop(gone);

    held(&*b, &lock, "b").await;
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move { b.changed(&lock, Duration::from_secs(3600)).await })
    };
    until_queued(&h, &lock, 2).await;
    let listed = a.list().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|r| r.lock.as_str()).filter(|name| name.contains(lock.as_str())).collect();
    assert_eq!(names, [lock.as_str()], "queue entries are not locks");

    a.release(&lease, Duration::ZERO).await.unwrap();
    // Far sooner than the vanished entry's lease could lapse (two minutes).
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the release never woke the waiter behind").unwrap();
    won(&*b, &lock, "b", TTL).await;
    assert_eq!(
        queue_entries(&h, &lock),
        Vec::<String>::new(),
        "the winner left the queue and cleared the vanished entry"
    );
}
