//! Redis with Sentinel across failovers that lose the last writes: the failover suite
//! (tests/failover/) on a primary, two replicas and three Sentinels reached by a
//! `redis+sentinel://` URL, and what only this store has: the Sentinel URL's errors, in one
//! line without a password, the binary run through it, and the epoch guard's other cases on
//! one server (a restart, leases from before the guard, a server whose scripts cannot run
//! INFO).

mod common;
mod failover;
mod servers;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{stderr_of, Sandbox};
use failover::{open, unique, SOON, TTL};
use leaderrun::store::{registry, Access, Acquire, ErrorKind, Renew, Store, FAILOVER_GRACE_HOLDER};
use servers::redis::Redis;
use servers::redis_sentinel::RedisSentinel;
use servers::replicated::Replicated;

failover_suite!(asynchronous: RedisSentinel::start());

/// A service the Sentinels do not monitor is refused for good, in one line that names it and
/// the ones they do, without either password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_service_name_is_one_clear_line() {
    let setup = RedisSentinel::start();
    let url = format!("{}?sentinel-password={}", setup.url_for("no-such-service"), setup.sentinel_password());
    let err = registry::parse_url(&url).unwrap().open(Access::Create).await.err().expect("opened a wrong service");
    assert_eq!(err.kind, ErrorKind::Refused, "{err:?}");
    let line = err.message;
    assert!(!line.contains('\n'), "{line:?}");
    assert!(
        line.contains("the Sentinels monitor no service named \"no-such-service\" (they monitor: leaderrun-test)"),
        "{line:?}"
    );
    assert!(!line.contains(setup.password()) && !line.contains(setup.sentinel_password()), "{line:?}");
}

/// Sentinels that ask for a password of their own refuse a URL without it, in one line that
/// says where it goes; a wrong password for the servers is refused too. Neither shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_password_is_refused_in_one_line() {
    let setup = RedisSentinel::start();
    let open_err = |url: String| async move {
        registry::parse_url(&url).unwrap().open(Access::Create).await.err().expect("opened without the password")
    };
    let without = open_err(setup.url_for(servers::redis_sentinel::SERVICE)).await;
    let wrong = setup.url().replace(setup.password(), "Wrong-Password-1");
    let wrong = open_err(wrong).await;
    for err in [without, wrong] {
        assert_eq!(err.kind, ErrorKind::Refused, "{err:?}");
        assert!(
            err.message.contains("authentication failed") && err.message.contains("?sentinel-password="),
            "{err:?}"
        );
        assert!(!err.message.contains(setup.password()) && !err.message.contains(setup.sentinel_password()));
        assert!(!err.message.contains("Wrong-Password-1") && !err.message.contains('\n'), "{err:?}");
    }
}

/// A plain store opened by the Sentinel URL follows a failover to the new primary: a holder
/// whose lease the replica had renews it there, and the epoch mark is kept beside the leases
/// (never listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_the_sentinels_to_the_new_primary() {
    let setup = RedisSentinel::start();
    let store = open(&setup).await;
    let lock = unique("follow");
    let lease = match store.acquire(&lock, "holder", TTL).await.unwrap() {
        Acquire::Won(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert_eq!(lease.token, 1, "a fresh store's first token");
    setup.catch_up();
    setup.fail_over();
    let started = std::time::Instant::now();
    let renewed = loop {
        match store.renew(&lease, TTL).await {
            Ok(renew) => break renew,
            Err(err) if err.is_transient() && started.elapsed() < SOON => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(err) => panic!("renew after the failover: {err}"),
        }
    };
    assert_eq!(renewed, Renew::Renewed);
    let listed: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    assert_eq!(listed, vec![lock.clone()], "the epoch mark is never listed");
    let mark = setup.primary_command(&["HGET", "leaderrun:epoch", "epoch"]).unwrap();
    assert!(matches!(mark, servers::redis_sentinel::Reply::Bulk(Some(_))), "{mark:?}");
}

/// `--store redis+sentinel://...` runs a child with the first token of a fresh store, and
/// shows neither password, even at -vv.
#[test]
fn the_binary_runs_through_the_sentinels() {
    let (setup, sb) = (RedisSentinel::start(), Sandbox::new());
    let child = ["sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/token""#];
    let out = sb.output(sb.at(&setup.url(), &[&["-vv", "--lock", "cli", "--"][..], &child].concat()));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert_eq!(sb.read("token").trim(), "1");
    assert!(!err.contains(setup.password()) && !err.contains(setup.sentinel_password()), "{err:?}");
}

async fn open_url(url: &str) -> Arc<dyn Store> {
    Arc::from(registry::parse_url(url).expect("a valid URL").open(Access::Create).await.expect("open"))
}

async fn won(store: &Arc<dyn Store>, lock: &str, ttl: Duration) -> u64 {
    match store.acquire(lock, "a", ttl).await.expect("acquire") {
        Acquire::Won(lease) => {
            store.release(&lease, Duration::ZERO).await.expect("release");
            lease.token
        }
        other => panic!("expected to win {lock:?}: {other:?}"),
    }
}

/// Refused while the grace lasts (reported as held by a lease the failover may have lost,
/// with the token the server shows), then won with a token at least the server's clock in
/// microseconds.
async fn graced_then_won(store: &Arc<dyn Store>, lock: &str, ttl: Duration, last_token: u64) {
    match store.acquire(lock, "b", ttl).await.expect("acquire") {
        Acquire::Held(record) => {
            assert_eq!(record.holder.as_deref(), Some(FAILOVER_GRACE_HOLDER), "{record:?}");
            assert_eq!(record.token, last_token, "{record:?}");
            assert!(record.expires_in.is_some_and(|left| left <= ttl), "{record:?}");
        }
        other => panic!("granted {lock:?} at once on a new epoch: {other:?}"),
    }
    let before_us = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    let started = std::time::Instant::now();
    let token = loop {
        match store.acquire(lock, "b", ttl).await.expect("acquire") {
            Acquire::Won(lease) => {
                store.release(&lease, Duration::ZERO).await.expect("release");
                break lease.token;
            }
            Acquire::Held(_) if started.elapsed() < SOON => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("never won {lock:?}: {other:?}"),
        }
    };
    // The server's clock and this one are the same machine's.
    assert!(token >= before_us, "token {token} below the clock in microseconds ({before_us})");
}

/// A server restarted with its append-only file has its data: it is the same store, not a new
/// epoch (Redis gives it a new replication id all the same), and tokens go on from 1, 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_append_only_file_is_no_failover() {
    let server = Redis::start();
    let lock = unique("restart-aof");
    assert_eq!(won(&open_url(&server.url()).await, &lock, TTL).await, 1);
    server.stop();
    server.start_again();
    assert_eq!(won(&open_url(&server.url()).await, &lock, TTL).await, 2, "granted at once, the next token");
}

/// A server restarted from a snapshot (no append-only file) may have lost the last leases, as
/// a promoted replica may: nothing is granted until the longest lease could have ended, and
/// tokens jump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_snapshot_waits_out_the_leases_it_may_have_lost() {
    let server = Redis::start_configured(&["--appendonly", "no", "--save", "3600 1"]);
    let (lock, ttl) = (unique("restart-rdb"), Duration::from_secs(1));
    assert_eq!(won(&open_url(&server.url()).await, &lock, ttl).await, 1);
    server.stop();
    server.start_again();
    graced_then_won(&open_url(&server.url()).await, &lock, ttl, 1).await;
}

/// Leases written before the epoch mark existed (an older leaderrun), or a mark deleted by
/// hand: the store is not empty, so the first acquire begins an epoch with a grace, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_without_a_mark_are_waited_out_once() {
    let server = Redis::start();
    let store = open_url(&server.url()).await;
    let (lock, ttl) = (unique("no-mark"), Duration::from_secs(1));
    assert_eq!(won(&store, &lock, ttl).await, 1);
    assert_eq!(server.command(&["DEL", "leaderrun:epoch"]).unwrap(), ":1\r\n");
    graced_then_won(&store, &lock, ttl, 1).await;
    let after = won(&store, &lock, ttl).await;
    assert!(after > 1_000_000_000_000_000, "tokens stay above the clock's: {after}");
}

/// A server that does not let scripts run INFO cannot state its epoch: leases are granted
/// without the guard (the store says so once, as a warning), and tokens go on from 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_scripts_cannot_run_info_grants_without_the_guard() {
    let server = Redis::start_configured(&["--rename-command", "INFO", ""]);
    let store = open_url(&server.url()).await;
    let lock = unique("no-info");
    assert_eq!(won(&store, &lock, TTL).await, 1);
    assert_eq!(won(&open_url(&server.url()).await, &lock, TTL).await, 2);
}

/// A user who may not run INFO, on a store whose mark another user's runs wrote with the
/// server's epoch: the change to no epoch at all is waited out once, as a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_run_info_waits_out_the_mark_of_one_who_may() {
    let server = Redis::start();
    let (lock, ttl) = (unique("no-info-user"), Duration::from_secs(1));
    assert_eq!(won(&open_url(&server.url()).await, &lock, ttl).await, 1);
    let acl = ["ACL", "SETUSER", "limited", "on", ">Limited-Secret-1", "~*", "&*", "+@all", "-info"];
    assert_eq!(server.command(&acl).unwrap(), "+OK\r\n");
    let limited = server.url().replace(&format!("://:{}@", server.password()), "://limited:Limited-Secret-1@");
    let store = open_url(&limited).await;
    graced_then_won(&store, &lock, ttl, 1).await;
    won(&store, &lock, ttl).await;
}
