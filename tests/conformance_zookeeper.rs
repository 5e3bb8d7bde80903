//! The conformance suite against a real ZooKeeper server (one per test, started in a temporary
//! directory), and what only this store has: error kinds and messages without the password, a
//! session timeout the server will not grant, a lease that ends with its session, and the path
//! in the URL.

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance::{count_requests, held, unique, won, Harness, SOON, TTL};
use leaderrun::store::{registry, Access};
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use leaderrun::timing::DEFAULT_TTL;
use servers::zookeeper::{ZooKeeper, DEFAULT_MAX_SESSION_TIMEOUT_MS, MAX_SESSION_TIMEOUT_MS, TICK_MS};

struct ZkHarness {
    server: ZooKeeper,
}

async fn zk() -> ZkHarness {
    ZkHarness { server: tokio::task::spawn_blocking(ZooKeeper::start).await.unwrap() }
}

async fn open_url(url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    registry::parse_url(url).expect("a valid URL").open(access).await.map(Arc::from)
}

#[async_trait]
impl Harness for ZkHarness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.url(), Access::Create).await.expect("open the ZooKeeper store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(zk());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = zk().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

fn check(err: StoreError, kind: ErrorKind, needle: &str) {
    assert_eq!(err.kind, kind, "{}", err.message);
    assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
    assert!(!err.message.contains("hunter2"), "{}", err.message);
    assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_went_wrong_without_the_password() {
    let h = zk().await;
    let port = h.server.port();

    // The first user creates the root with a creator-only ACL (ZooKeeper's digest scheme).
    let right = format!("zk://app:hunter2@127.0.0.1:{port}");
    let store = open_url(&right, Access::Create).await.expect("the right password");
    let lock = unique("auth");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    store.release(&lease, Duration::ZERO).await.unwrap();

    // A command that reads (status, list, release) finds a wrong password when it opens the store;
    // a run at its first request, its acquire (ZooKeeper's digest scheme accepts any password at
    // connect: only the nodes' ACLs refuse it).
    let wrong = format!("zk://app:hunter2x@127.0.0.1:{port}");
    check(open_url(&wrong, Access::Existing).await.err().unwrap(), ErrorKind::Refused, "not authorized");
    let run = open_url(&wrong, Access::Create).await.expect("a run opens without a request");
    check(run.acquire(&lock, "b", TTL).await.unwrap_err(), ErrorKind::Refused, "app:***@");
    check(run.acquire(&unique("auth-new"), "b", TTL).await.unwrap_err(), ErrorKind::Refused, "not authorized");
    let anonymous = format!("zk://127.0.0.1:{port}");
    check(open_url(&anonymous, Access::Existing).await.err().unwrap(), ErrorKind::Refused, "not authorized");
    let run = open_url(&anonymous, Access::Create).await.unwrap();
    check(run.acquire(&lock, "b", TTL).await.unwrap_err(), ErrorKind::Refused, "not authorized");

    let closed = format!("zk://app:hunter2@127.0.0.1:{}", servers::free_port());
    check(open_url(&closed, Access::Create).await.err().unwrap(), ErrorKind::Unavailable, "***");
    // TLS without the server's CA is bad usage, found before anything connects.
    let tls = format!("zk://app:hunter2@127.0.0.1:{port}?tls=1");
    let err = registry::parse_url(&tls).expect_err("TLS needs cacert=");
    assert!(err.contains("cacert=FILE") && !err.contains("hunter2") && !err.contains('\n'), "{err}");

    // A ttl longer than the longest session the server grants: the server would expire the
    // lease before its holder's deadline.
    let too_long = Duration::from_millis(MAX_SESSION_TIMEOUT_MS + 1000);
    let err = store.acquire(&unique("long"), "a", too_long).await.expect_err("a session the server will not grant");
    check(err.clone(), ErrorKind::Refused, "maxSessionTimeout");
    assert!(err.message.contains(&MAX_SESSION_TIMEOUT_MS.to_string()), "{}", err.message);

    // A server that goes away under an open client: transient.
    h.server.stop();
    let err = store.status("x").await.expect_err("the server is down");
    check(err, ErrorKind::Unavailable, &format!(":{port}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_ends_with_its_session() {
    let h = zk().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("session");
    let first = won(&*a, &lock, "a", Duration::from_secs(2)).await;
    held(&*b, &lock, "b").await;
    // The holder's process goes away without releasing: its session stops, the server expires
    // it, and a waiter hears of it.
    drop(a);
    let started = Instant::now();
    let second = loop {
        if let Acquire::Won(lease) = b.acquire(&lock, "b", TTL).await.unwrap() {
            break lease;
        }
        assert!(started.elapsed() < SOON, "the session of a dropped holder never expired");
        b.changed(&lock, Duration::from_secs(5)).await;
    };
    assert!(second.token > first.token);
    let fresh = h.open().await;
    assert!(matches!(fresh.renew(&first, TTL).await.unwrap(), Renew::Lost(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_path_separates_users_of_one_ensemble() {
    let h = zk().await;
    let (default, other) =
        (h.open().await, open_url(&format!("{}/team-b/locks", h.server.url()), Access::Create).await.unwrap());
    let lock = unique("shared-name");
    won(&*default, &lock, "a", TTL).await;
    let lease = won(&*other, &lock, "b", TTL).await;
    assert_eq!(lease.token, 1, "another path, another token sequence");
    held(&*other, &lock, "c").await;
    let listed = other.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holder.as_deref(), Some("b"));
    assert_eq!(default.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_session_outlasts_the_ttl_by_a_quarter_and_a_tick() {
    let h = zk().await;
    let store = h.open().await;
    let lock = unique("quarter");
    let lease = won(&*store, &lock, "a", TTL).await;
    // The holder's session timeout is the most the lease can have left, and it must cover a
    // full ttl after any renewal even when that renewal's news never reached the leader: a
    // follower passes its clients' activity on only at its pings, every half tick.
    let status = store.status(&lock).await.unwrap();
    let session = status.expires_in.expect("a held lock's session timeout");
    assert!(session >= TTL * 5 / 4 + Duration::from_millis(TICK_MS), "{status:?}");
    assert!(session <= Duration::from_millis(MAX_SESSION_TIMEOUT_MS), "{status:?}");
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_longest_ttl_is_the_longest_the_servers_sessions_allow() {
    let server = tokio::task::spawn_blocking(ZooKeeper::start_with_default_session_limits).await.unwrap();
    let store = open_url(&server.url(), Access::Create).await.unwrap();
    let longest = store.longest_ttl(DEFAULT_TTL).await.unwrap().expect("ZooKeeper's maxSessionTimeout is a limit");
    assert!(longest > Duration::ZERO && longest < Duration::from_millis(DEFAULT_MAX_SESSION_TIMEOUT_MS));
    assert_eq!(store.longest_ttl(DEFAULT_TTL).await.unwrap(), Some(longest), "learned once");

    // A lease of exactly that ttl gets a session the server grants, within its limit.
    let lock = unique("longest");
    let lease = won(&*store, &lock, "a", longest).await;
    assert_eq!(store.renew(&lease, longest).await.unwrap(), Renew::Renewed);
    let session = store.status(&lock).await.unwrap().expires_in.expect("held");
    assert!(session >= longest * 5 / 4 + Duration::from_millis(TICK_MS), "{session:?} for {longest:?}");
    assert!(session <= Duration::from_millis(DEFAULT_MAX_SESSION_TIMEOUT_MS), "{session:?}");

    // One ms more would need a session the server does not grant: refused, in one line.
    let longer = longest + Duration::from_millis(1);
    let err = store.acquire(&unique("longer"), "a", longer).await.expect_err("a session over maxSessionTimeout");
    check(err.clone(), ErrorKind::Refused, "maxSessionTimeout");
    let most = humantime::format_duration(longest).to_string();
    assert!(err.message.contains(&DEFAULT_MAX_SESSION_TIMEOUT_MS.to_string()), "{}", err.message);
    assert!(err.message.contains(&format!("at most {most},")), "names the longest ttl: {}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_with_the_servers_ca() {
    let server = tokio::task::spawn_blocking(ZooKeeper::start_tls).await.unwrap();
    let store = open_url(&server.tls_url(), Access::Create).await.expect("open over TLS with a client certificate");
    let lock = unique("tls");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    // The same lock seen over the plain port: one server, one lease.
    let plain = open_url(&server.url(), Access::Create).await.unwrap();
    assert_eq!(plain.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
    held(&*plain, &lock, "b").await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    won(&*plain, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_errors_say_what_went_wrong() {
    let server = tokio::task::spawn_blocking(ZooKeeper::start_tls).await.unwrap();
    let url = server.tls_url();
    let base = url.split_once('?').unwrap().0.to_string();
    let certs = server.certs();
    let one_line = |err: &StoreError| assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    // Another CA than the server's: its certificate is not trusted.
    let other = servers::tls::Certs::new();
    let (cert, key) = (certs.client_cert().display().to_string(), certs.client_key().display().to_string());
    let untrusted = format!("{base}?tls=1&cacert={}&cert={cert}&key={key}", other.ca().display());
    let err = open_url(&untrusted, Access::Create).await.err().expect("an untrusted server certificate");
    one_line(&err);
    assert!(err.message.contains("TLS handshake"), "{}", err.message);
    // No client certificate, which the server requires.
    let err = open_url(&format!("{base}?tls=1&cacert={}", certs.ca().display()), Access::Create)
        .await
        .err()
        .expect("no client cert");
    one_line(&err);
    // A CA file that is not there.
    let err = open_url(&format!("{base}?tls=1&cacert=/nonexistent/ca.pem"), Access::Create)
        .await
        .err()
        .expect("a missing CA file");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("cacert=/nonexistent/ca.pem"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abandon_clears_a_child_left_behind_the_holder() {
    use zookeeper_client::{Acls, Client, CreateMode};
    let h = zk().await;
    let (a, b, fresh) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("left-behind");
    let lease = won(&*a, &lock, "a", TTL).await;
    // What an acquire whose answer never came leaves: a child of this identity behind the
    // holder's, on a session that lives on for a while.
    let ghost = Client::connector()
        .with_session_timeout(Duration::from_secs(60))
        .with_detached()
        .connect(&format!("127.0.0.1:{}", h.server.port()))
        .await
        .unwrap();
    let data = r#"{"holder":"ghost","acquired_ms":1,"session_timeout_ms":60000}"#;
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    ghost.create(&format!("/leaderrun/{lock}/lease-"), data.as_bytes(), &options).await.unwrap();

    fresh.abandon(&lock, "ghost").await.unwrap();
    assert_eq!(b.status(&lock).await.unwrap().holder.as_deref(), Some("a"), "the holder is not touched");
    a.release(&lease, Duration::ZERO).await.unwrap();
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token);
}

/// A waiting standby keeps its watch on the holder's node across `changed` calls: after the
/// first wait (joining the queue, reading it, a watch, its next lease's session) nothing is sent
/// while the holder lives; a release still wakes it.
#[tokio::test]
async fn an_idle_standby_keeps_one_watch_and_sends_nothing() {
    let (requests, _counting) = count_requests();
    let h = zk().await;
    conformance::an_idle_standby_sends_nothing(&h, &requests).await;
}

/// `leaderrun watch` watches what `status` reads (the lock's children, the lowest one's data):
/// it sees every change, a session's expiry too (the ephemeral child goes), asks nothing while
/// nothing changes, and joins no queue.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = count_requests();
    let h = zk().await;
    conformance::a_watcher_sees_changes_and_takes_no_turn(&h, &requests).await;
}

/// Waiters queue, each watching the one ahead of it: a release wakes one waiter, which reads the
/// lock and takes it (a multi-op); the holder's release deletes its child and its place in the
/// queue in one multi-op. Three requests per handoff, however many wait (a herd woken at every
/// release would send about a hundred times more).
#[tokio::test]
async fn a_hundred_waiters_each_get_their_turn_once() {
    let (requests, _counting) = count_requests();
    let h = zk().await;
    conformance::a_hundred_waiters_take_turns(&h, &requests, 2.0..10.0).await;
}

/// The queue is only a hint: a waiter that died without a word (its store dropped, as a SIGKILLed
/// process leaves it) holds up the one behind it only until its reads session times out (4 s),
/// which then gets the lock after a release that nobody heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_behind_a_vanished_waiter_still_gets_its_turn() {
    let h = zk().await;
    let (a, vanishing, behind) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("vanished");
    let lease = won(&*a, &lock, "a", TTL).await;
    // First in the queue (it watches the holder), then the one behind it (it watches the first).
    held(&*vanishing, &lock, "vanishing").await;
    vanishing.changed(&lock, Duration::from_secs(1)).await;
    held(&*behind, &lock, "behind").await;
    behind.changed(&lock, Duration::from_secs(1)).await;
    let raw = zookeeper_client::Client::connect(&format!("127.0.0.1:{}", h.server.port())).await.unwrap();
    let queue = raw.list_children(&format!("/leaderrun/{lock}/queue")).await.unwrap();
    assert_eq!(queue.len(), 2, "both wait in the queue: {queue:?}");
    // The one behind waits on, far longer than the test's bound: only the queue can end its wait.
    let waiting = {
        let (behind, lock) = (behind.clone(), lock.clone());
        tokio::spawn(async move { behind.changed(&lock, Duration::from_secs(3600)).await })
    };
    drop(vanishing);
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, waiting).await.expect("the waiter behind the vanished one was never woken").unwrap();
    let next = won(&*behind, &lock, "behind", TTL).await;
    assert!(next.token > lease.token);
}

/// A one-shot run on a free lock:
/// 1. connect: the reads session, whose granted timeout bounds the servers' tick;
/// 2. list the lock's children (none: free; a held lock would cost one read of the holder's);
/// 3. connect: the lease's own session (ttl + 25% + a tick);
/// 4. one multi-op: the child, and the token into the lock's node, guarded by its version as
///    listed (or the lock's node made with it, on a lock name's first run); the child's sequence
///    number is the count of children created that the list saw, so it is the only child;
/// 5. one multi-op: release, deleting the child (with --min-hold, replacing it).
///
/// Without --ttl, `longest_ttl` connects the session the default ttl's lease needs, and the
/// lease then uses it: still five.
#[tokio::test]
async fn a_one_shot_run_takes_five_requests() {
    let (requests, _counting) = count_requests();
    let h = zk().await;
    // An earlier run on another lock made the root.
    let earlier = h.open().await;
    let lease = won(&*earlier, &unique("earlier"), "earlier", TTL).await;
    earlier.release(&lease, Duration::ZERO).await.unwrap();

    let lock = unique("one-shot");
    let before = requests.count();
    let store = h.open().await;
    let lease = won(&*store, &lock, "a", TTL).await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(requests.count() - before, 5, "the first run of a lock name, with --ttl");

    let before = requests.count();
    let store = h.open().await;
    let ttl = store.longest_ttl(DEFAULT_TTL).await.unwrap().expect("ZooKeeper limits sessions");
    let lease = won(&*store, &lock, "b", ttl).await;
    store.release(&lease, Duration::from_secs(10)).await.unwrap();
    assert_eq!(requests.count() - before, 5, "a later run, without --ttl, with --min-hold");
    assert_eq!(h.open().await.status(&lock).await.unwrap().holder.as_deref(), Some("b"), "kept for --min-hold");

    // With --lock-delay the lease asked for is the ttl + the delay: the session learnt for it
    // serves it, and the server keeps it that long.
    let before = requests.count();
    let store = h.open().await;
    let delayed = DEFAULT_TTL + Duration::from_secs(30);
    assert_eq!(store.longest_ttl(delayed).await.unwrap(), Some(delayed), "the servers grant its session");
    let lock = unique("delayed");
    let lease = won(&*store, &lock, "c", delayed).await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(requests.count() - before, 5, "a run with a --lock-delay, without --ttl");
    let lease = won(&*store, &lock, "c", delayed).await;
    let session = store.status(&lock).await.unwrap().expires_in.expect("held");
    assert!(session >= delayed * 5 / 4 + Duration::from_millis(TICK_MS), "{session:?} for a lease of {delayed:?}");
    store.release(&lease, Duration::ZERO).await.unwrap();
}
