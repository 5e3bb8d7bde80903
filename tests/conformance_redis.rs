//! The conformance suite against a real Redis server (one per test, started in a temporary
//! directory), and what only this store has: the key prefix, error kinds and messages
//! without the password, and riding out a server restart with the same client.

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, waiting, won, Harness, TTL};
use leaderrun::store::{registry, Access};
use leaderrun::store::{ErrorKind, Renew, Store, StoreError};
use servers::redis::Redis;

struct Rd {
    server: Redis,
    /// Added to the server's URL by every `open` (e.g. `?protocol=resp3`).
    params: &'static str,
}

async fn rd() -> Rd {
    Rd { server: Redis::start(), params: "" }
}

async fn open_url(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    registry::parse_url(url).expect("a valid URL").open(Access::Create).await.map(Arc::from)
}

#[async_trait]
impl Harness for Rd {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&format!("{}{}", self.server.url(), self.params)).await.expect("open the Redis store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(rd());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_prefix_separates_users_of_one_server() {
    let rd = rd().await;
    let (default, other) = (rd.open().await, open_url(&format!("{}?prefix=team-b/", rd.server.url())).await.unwrap());
    let lock = unique("shared-name");
    won(&*default, &lock, "a", TTL).await;
    let lease = won(&*other, &lock, "b", TTL).await;
    assert_eq!(lease.token, 1, "another prefix, another token sequence");
    held(&*other, &lock, "c").await;
    assert_eq!(other.list().await.unwrap().len(), 1);
    let key = format!("team-b/lock:{lock}");
    assert_eq!(rd.server.command(&["EXISTS", &key]).unwrap(), ":1\r\n");
}

/// What a refusal of a server that may evict keys must say: the setting, the fix and the
/// way to accept the risk, in one line without the password.
fn assert_eviction_refusal(err: StoreError, needle: &str, password: &str) {
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    for part in [needle, "noeviction", "?allow-eviction=1", "***"] {
        assert!(err.message.contains(part), "{part:?} missing from {:?}", err.message);
    }
    assert!(!err.message.contains(password) && !err.message.contains('\n'), "{:?}", err.message);
}

/// A server that may evict a lease or the token counter is refused, even while its
/// maxmemory is 0 (as here): a CONFIG SET maxmemory later would arm the policy under a
/// running holder. The URL may accept the risk; the default server (noeviction) opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_may_evict_is_refused_unless_the_url_accepts_it() {
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let server = Redis::start_configured(&["--maxmemory-policy", policy]);
        let err = open_url(&server.url()).await.err().expect("a server that may evict keys was opened");
        assert_eviction_refusal(err, &format!("maxmemory-policy is {policy}"), server.password());
        let store = open_url(&format!("{}?allow-eviction=1", server.url())).await.expect("the risk was accepted");
        won(&*store, &unique("evicting"), "a", TTL).await;
    }
    let rd = rd().await;
    won(&*rd.open().await, &unique("noeviction"), "a", TTL).await;
}

/// Where CONFIG is disabled, as managed services often do, the policy is read from INFO;
/// where INFO is too, the server is refused: a policy nobody can see may be one that evicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_policy_is_read_from_info_where_config_is_disabled() {
    let no_config = ["--rename-command", "CONFIG", ""];
    let server = Redis::start_configured(&[&no_config[..], &["--maxmemory-policy", "allkeys-lfu"]].concat());
    let err = open_url(&server.url()).await.err().expect("a server that may evict keys was opened");
    assert_eviction_refusal(err, "maxmemory-policy is allkeys-lfu", server.password());
    let server = Redis::start_configured(&no_config);
    won(&*open_url(&server.url()).await.expect("noeviction, read from INFO"), &unique("info"), "a", TTL).await;

    let server = Redis::start_configured(&[&no_config[..], &["--rename-command", "INFO", ""]].concat());
    let err = open_url(&server.url()).await.err().expect("a server whose policy cannot be seen was opened");
    assert_eviction_refusal(err, "maxmemory-policy cannot be read", server.password());
    let store = open_url(&format!("{}?allow-eviction=1", server.url())).await.expect("the risk was accepted");
    won(&*store, &unique("unseen"), "a", TTL).await;
}

/// A lease released with a keep is given up: it is never renewed again (so that `revoke` may
/// free it at once), and when `revoke` frees it, a waiter hears of it as of a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_lease_is_not_renewed_and_its_revoke_wakes_waiters() {
    let rd = rd().await;
    let (a, admin, b) = (rd.open().await, rd.open().await, rd.open().await);
    let lock = unique("kept");
    let lease = won(&*a, &lock, "a", TTL).await;
    a.release(&lease, Duration::from_secs(3600)).await.unwrap();
    assert!(matches!(a.renew(&lease, TTL).await.unwrap(), Renew::Lost(_)), "a kept lease was renewed");
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move { b.changed(&lock, Duration::from_secs(3600)).await })
    };
    // Subscribed or not, the waiter returns once the lock is free; the bound is only a backstop.
    tokio::time::sleep(Duration::from_millis(100)).await;
    admin.revoke(&lock).await.unwrap().expect("a kept lock is held");
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the revoke never woke the waiter").unwrap();
    won(&*b, &lock, "b", TTL).await;
}

/// `?protocol=resp3` is the redis crate's own parameter: the store's answers read the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resp3_connections_when_the_url_asks() {
    let rd = Rd { server: Redis::start(), params: "?protocol=resp3" };
    conformance::renew_by_the_holder_only(&rd).await;
    conformance::release_with_keep_holds_until_then(&rd).await;
    conformance::status_list_and_revoke_agree(&rd).await;
    conformance::a_release_wakes_a_waiter(&rd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_went_wrong_without_the_password() {
    let rd = rd().await;
    let port = rd.server.port();
    let check = |err: StoreError, kind: ErrorKind, needle: &str, secret: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(err.message.contains("***") && !err.message.contains(secret), "{}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let wrong = format!("redis://:not-the-password@127.0.0.1:{port}/0");
    check(open_url(&wrong).await.err().unwrap(), ErrorKind::Refused, "authentication failed", "not-the-password");
    let user = format!("redis://nobody:{}@127.0.0.1:{port}/0", rd.server.password());
    check(open_url(&user).await.err().unwrap(), ErrorKind::Refused, "nobody:***@", rd.server.password());
    let plain_as_tls = format!("rediss://:{}@127.0.0.1:{port}/0?cacert=/nonexistent/ca.pem", rd.server.password());
    check(
        open_url(&plain_as_tls).await.err().unwrap(),
        ErrorKind::Refused,
        "cacert=/nonexistent",
        rd.server.password(),
    );
    // A URL that is wrong in itself is bad usage, refused before anything connects.
    let files_without_tls = format!("redis://:{}@127.0.0.1:{port}/0?cacert=/ca.pem", rd.server.password());
    let err = registry::parse_url(&files_without_tls).err().unwrap();
    assert!(err.contains("rediss://") && err.contains("***") && !err.contains(rd.server.password()), "{err}");

    let closed = servers::free_port();
    let url = format!("redis://:{}@127.0.0.1:{closed}/0", rd.server.password());
    check(open_url(&url).await.err().unwrap(), ErrorKind::Unavailable, "refused", rd.server.password());

    // A server that goes away under an open client: transient.
    let store = rd.open().await;
    rd.server.stop();
    let err = store.status("x").await.expect_err("the server is down");
    check(err, ErrorKind::Unavailable, &format!(":{port}/"), rd.server.password());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let rd = rd().await;
    conformance::a_client_rides_out_a_server_restart(&rd, || rd.server.stop(), || rd.server.start_again()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_with_the_servers_ca() {
    let server = tokio::task::spawn_blocking(Redis::start_tls).await.unwrap();
    let store = open_url(&server.tls_url()).await.expect("open over TLS with the CA and a client certificate");
    let lock = unique("tls");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    // The same lock seen over the plain port: one server, one lease.
    let plain = open_url(&server.url()).await.unwrap();
    assert_eq!(plain.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
    held(&*plain, &lock, "b").await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    won(&*plain, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_errors_say_what_went_wrong_without_the_password() {
    let server = tokio::task::spawn_blocking(Redis::start_tls).await.unwrap();
    let password = server.password().to_string();
    let check = |err: StoreError, kind: ErrorKind, needle: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(err.message.contains("***") && !err.message.contains(&password), "{}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let certs = server.certs();
    let base = server.tls_url().split_once('?').unwrap().0.to_string();
    let (ca, cert, key) = (certs.ca().display().to_string(), certs.client_cert(), certs.client_key());
    // The system's CAs do not know the test CA.
    check(open_url(&base).await.err().unwrap(), ErrorKind::Refused, "invalid peer certificate");
    // The server asks for a client certificate and none is shown.
    check(open_url(&format!("{base}?cacert={ca}")).await.err().unwrap(), ErrorKind::Refused, "TLS");
    // Half a client certificate: bad usage, refused before anything connects.
    let err = registry::parse_url(&format!("{base}?cacert={ca}&cert={}", cert.display())).err().unwrap();
    assert!(err.contains("go together") && err.contains("***") && !err.contains(&password), "{err}");
    // TLS spoken to the plain port: the handshake never completes.
    let plain = format!(
        "rediss://:{password}@127.0.0.1:{}/0?cacert={ca}&cert={}&key={}",
        server.port(),
        cert.display(),
        key.display()
    );
    let err = open_url(&plain).await.err().unwrap();
    assert!(!err.message.contains(&password) && !err.message.contains('\n'), "{}", err.message);
}

/// How many clients the server has blocked (in BLPOP), by INFO.
fn blocked_clients(server: &Redis) -> usize {
    let info = server.command(&["INFO", "clients"]).expect("INFO clients");
    let line = info.lines().find_map(|l| l.strip_prefix("blocked_clients:")).expect("blocked_clients in INFO");
    line.trim().parse().expect("a count")
}

/// Wait (with a generous bound) until the server has `n` clients blocked.
async fn until_blocked(server: &Redis, n: usize) {
    conformance::until_count("blocked clients", n, || blocked_clients(server)).await
}

/// Two waiters block; a release wakes one of them, and the other stays blocked: a handoff
/// costs one waiter's acquire, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_wakes_one_waiter_only() {
    let rd = rd().await;
    let (a, b, c) = (rd.open().await, rd.open().await, rd.open().await);
    let lock = unique("one-woken");
    let lease = won(&*a, &lock, "a", TTL).await;
    let (wb, wc) = (waiting(&b, &lock), waiting(&c, &lock));
    until_blocked(&rd.server, 2).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    until_blocked(&rd.server, 1).await;
    let woken = tokio::time::timeout(conformance::SOON, async {
        loop {
            if wb.is_finished() || wc.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    woken.await.expect("the release woke nobody");
    assert!(!(wb.is_finished() && wc.is_finished()), "both waiters woke");
    assert_eq!(blocked_clients(&rd.server), 1, "the other waiter is still blocked");
}

/// A wait that reaches its bound leaves its BLPOP blocked for the next: an idle standby sends
/// nothing, and a turn that comes between two waits is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_between_two_waits_is_kept_for_the_next() {
    let rd = rd().await;
    let (a, b) = (rd.open().await, rd.open().await);
    let lock = unique("between");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_millis(100)).await;
    assert_eq!(blocked_clients(&rd.server), 1, "the wait stays blocked after its bound");
    a.release(&lease, Duration::ZERO).await.unwrap();
    until_blocked(&rd.server, 0).await;
    tokio::time::timeout(conformance::SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the turn that came between two waits was lost");
    won(&*b, &lock, "b", TTL).await;
}

/// A waiter that stops waiting (its run ends: the store is dropped while it is blocked) must
/// not take the next release with it: the waiter that blocks after it still gets its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_that_leaves_does_not_swallow_a_release() {
    let rd = rd().await;
    let (a, b, c) = (rd.open().await, rd.open().await, rd.open().await);
    let lock = unique("given-up");
    let lease = won(&*a, &lock, "a", TTL).await;
    let given_up = waiting(&b, &lock);
    until_blocked(&rd.server, 1).await;
    given_up.abort();
    let _ = given_up.await;
    drop(b);
    until_blocked(&rd.server, 0).await;
    let waiter = waiting(&c, &lock);
    until_blocked(&rd.server, 1).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the release never woke the waiter").unwrap();
    won(&*c, &lock, "c", TTL).await;
}

/// A release while nobody was blocked (the waiter between its read and its wait) still wakes
/// the waiter that blocks next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_before_the_wait_is_not_missed() {
    let rd = rd().await;
    let (a, b) = (rd.open().await, rd.open().await);
    let lock = unique("before-wait");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the release before the wait was missed");
    won(&*b, &lock, "b", TTL).await;
}

/// A user whose ACL does not allow BLPOP still waits: on the release channel, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_without_blpop_is_woken_by_the_channel() {
    let rd = rd().await;
    let acl =
        ["ACL", "SETUSER", "waiter", "on", ">waiter-pw", "~leaderrun:*", "&leaderrun:released", "+@all", "-blpop"];
    assert_eq!(rd.server.command(&acl).unwrap(), "+OK\r\n");
    let url = format!("redis://waiter:waiter-pw@127.0.0.1:{}/0", rd.server.port());
    let (a, b) = (rd.open().await, open_url(&url).await.expect("open as the user without BLPOP"));
    let lock = unique("no-blpop");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    // The first wait finds BLPOP refused and subscribes: it may return early (it reads once
    // after subscribing), so wait until the lock is seen free.
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            loop {
                b.changed(&lock, Duration::from_secs(3600)).await;
                if !b.status(&lock).await.unwrap().is_held() {
                    break;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(blocked_clients(&rd.server), 0, "nobody blocks in BLPOP");
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the release never woke the waiter").unwrap();
    won(&*b, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_standby_sends_nothing() {
    let (requests, _counting) = conformance::count_requests();
    conformance::an_idle_standby_sends_nothing(&rd().await, &requests).await;
}

/// A hundred waiters, each woken in turn by the release before it: a few requests a
/// handoff, however many wait.
#[tokio::test]
async fn a_hundred_waiters_each_get_their_turn_once() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_hundred_waiters_take_turns(&rd().await, &requests, 2.0..10.0).await;
}

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&rd().await, &requests).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_write_is_announced_to_a_watcher() {
    conformance::announced::each_write_is_announced_to_a_watcher(&rd().await).await;
}
