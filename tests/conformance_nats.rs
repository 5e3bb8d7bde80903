//! The conformance suite against a real NATS server with JetStream (one per test, started
//! in a temporary directory), and what only this store has: Choria compatibility (its
//! leader election bucket, its create and evict), error kinds and messages without the
//! password, lock names that are not NATS keys, riding out a server restart, and the waiters'
//! queue group (which waiter a release wakes, and what a frozen one or a user without
//! subscribe permission costs the others).

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use conformance::{count_requests, held, held_for, unique, won, Harness, SOON, TTL};
use leaderrun::store::{registry, Access};
use leaderrun::store::{Acquire, ErrorKind, Observing, Renew, Store, StoreError};
use leaderrun::timing::DEFAULT_TTL;
use servers::nats::{Nats, USER};

struct Nt {
    server: Nats,
}

async fn nt() -> Nt {
    Nt { server: Nats::start() }
}

async fn open_url(url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    registry::parse_url(url).expect("a valid URL").open(access).await.map(Arc::from)
}

#[async_trait]
impl Harness for Nt {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.url(), Access::Create).await.expect("open the NATS store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(nt());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let nt = nt().await;
    conformance::a_client_rides_out_a_server_restart(&nt, || nt.server.stop(), || nt.server.start_again()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn choria_sees_a_leaderrun_holder_and_leaderrun_sees_a_choria_leader() {
    let nt = nt().await;
    let choria = nt.server.choria_bucket_with_max_age(CHORIA_MAX_AGE).await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let store = open_url(&url, Access::Create).await.unwrap();
    // Choria's bucket removes an expired entry silently (a max age, no markers): a standby
    // cannot rely on its watch to hear of an expiry.
    assert!(!store.sees_expiry());

    // leaderrun holds my_app (won as Choria wins: confirmed after the cool-down): Choria's tools
    // show it as the leader, its campaigners lose.
    let lease = won(&*store, "my_app", "host-a leaderrun", CHORIA_TTL).await;
    let value = choria.get("my_app").await.unwrap().expect("the key exists");
    assert_eq!(&value[..], b"host-a leaderrun", "the value is the holder identity, plain");
    assert!(choria.create("my_app", "choria-b".into()).await.is_err(), "a Choria campaigner must not win");
    assert_eq!(store.renew(&lease, CHORIA_TTL).await.unwrap(), Renew::Renewed);
    assert_eq!(&choria.get("my_app").await.unwrap().unwrap()[..], b"host-a leaderrun");
    let status = store.status("my_app").await.unwrap();
    assert_eq!((status.token, status.campaigner), (lease.token, None), "a leaderrun holder keeps its token");
    assert!(status.held_since.is_some());

    // Choria's evict (deleting the key) makes the holder stand down at its next renewal.
    choria.delete("my_app").await.unwrap();
    assert_eq!(store.renew(&lease, CHORIA_TTL).await.unwrap(), Renew::Lost(None));
    assert!(!store.status("my_app").await.unwrap().is_held());

    // A Choria leader shows as the holder and keeps leaderrun out.
    let revision = choria.create("my_app", "choria-c".into()).await.expect("Choria campaigns on a freed key");
    let status = store.status("my_app").await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("choria-c"), revision));
    assert!(status.expires_in.is_some_and(|left| left <= CHORIA_MAX_AGE), "{status:?}");
    // Its key keeps only its last write: shown as a renewal, not as when it was taken.
    let campaigner = status.campaigner.expect("a Choria leader is another program's campaigner");
    assert_eq!((status.held_since, campaigner.renews_every), (None, CHORIA_MAX_AGE.mul_f64(0.75)));
    held_for(&*store, "my_app", "host-d", CHORIA_TTL).await;
    assert!(store.list().await.unwrap().iter().any(|r| r.lock == "my_app" && r.holder.as_deref() == Some("choria-c")));

    // Once Choria's leader lets go, leaderrun wins, with a larger token.
    choria.delete("my_app").await.unwrap();
    let next = won(&*store, "my_app", "host-d", CHORIA_TTL).await;
    assert!(next.token > revision);
}

/// A Choria bucket with a small max age (Choria's smallest), so that a cool-down is short.
const CHORIA_MAX_AGE: Duration = Duration::from_secs(4);
/// A ttl that fits it (at most one campaign interval, 3 s, + 200 ms).
const CHORIA_TTL: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_choria_bucket_a_win_is_confirmed_after_the_cool_down_and_an_evict_loses_it() {
    let nt = nt().await;
    let choria = nt.server.choria_bucket_with_max_age(CHORIA_MAX_AGE).await;
    let store = open_url(&format!("{}/CHORIA_LEADER_ELECTION", nt.server.url()), Access::Create).await.unwrap();
    let (lease, after) = match store.acquire("my_app", "a", CHORIA_TTL).await.unwrap() {
        Acquire::Confirm { lease, after } => (lease, after),
        other => panic!("a win in a Choria bucket must be confirmed: {other:?}"),
    };
    // One campaign interval (0.75 x max age, lengthened for clock drift) + Choria's 200 ms.
    assert!(after > CHORIA_MAX_AGE.mul_f64(0.75) + Duration::from_millis(200) && after < CHORIA_MAX_AGE, "{after:?}");
    held_for(&*store, "my_app", "b", CHORIA_TTL).await;
    assert!(choria.create("my_app", "choria".into()).await.is_err(), "Choria sees the key taken");
    // Evicted during the cool-down: the confirmation finds it lost.
    choria.delete("my_app").await.unwrap();
    assert!(matches!(store.renew(&lease, CHORIA_TTL).await.unwrap(), Renew::Lost(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keep_in_a_choria_bucket_ends_for_leaderrun_when_asked() {
    let nt = nt().await;
    let choria = nt.server.choria_bucket_with_max_age(Duration::from_secs(60)).await;
    let store = open_url(&format!("{}/CHORIA_LEADER_ELECTION", nt.server.url()), Access::Create).await.unwrap();
    assert_eq!(store.longest_keep().await.unwrap(), Some(Duration::from_secs(60)));
    let lease = match store.acquire("cron", "a", CHORIA_TTL).await.unwrap() {
        Acquire::Confirm { lease, .. } => lease,
        other => panic!("{other:?}"),
    };
    // Kept 1.5 s from the acquisition: the bucket keeps the entry for a minute, Choria's
    // campaigners wait for that, leaderrun takes it over once the keep has passed.
    store.release(&lease, Duration::from_millis(1500)).await.unwrap();
    held(&*store, "cron", "b").await;
    let started = std::time::Instant::now();
    let next = loop {
        match store.acquire("cron", "b", CHORIA_TTL).await.unwrap() {
            Acquire::Confirm { lease, .. } => break lease,
            Acquire::Won(lease) => panic!("won without a cool-down: {lease:?}"),
            Acquire::Held(_) | Acquire::Unproven { .. } => assert!(started.elapsed() < SOON, "the keep never ended"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(next.token > lease.token);
    assert!(choria.create("cron", "choria".into()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ttl_that_does_not_fit_a_choria_bucket_is_refused_as_unfit() {
    let nt = nt().await;
    nt.server.choria_bucket().await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let store = open_url(&url, Access::Create).await.unwrap();
    // Max age 60 s: Choria campaigns every 45 s, a Choria standby starts 45.2 s after an evict.
    assert_eq!(store.longest_ttl(DEFAULT_TTL).await.unwrap(), Some(Duration::from_millis(45_200)));
    for ttl in [Duration::from_secs(90), Duration::from_secs(60), Duration::from_millis(45_201)] {
        let err = store.acquire("my_app", "a", ttl).await.expect_err("longer than Choria's interval + 200 ms");
        assert_eq!(err.kind, ErrorKind::Unfit, "{}", err.message);
        assert!(err.message.contains("CHORIA_LEADER_ELECTION") && err.message.contains("45s 200ms"), "{}", err.message);
        assert!(!err.message.contains('\n') && !err.message.contains(nt.server.password()), "{}", err.message);
    }
    assert!(!store.status("my_app").await.unwrap().is_held(), "nothing was written");

    // A bucket Choria itself would refuse (max age under 4 s: its interval would be too close).
    let js = nt.server.jetstream().await;
    let short =
        kv::Config { bucket: "SHORT".into(), history: 1, max_age: Duration::from_secs(3), ..Default::default() };
    js.create_key_value(short).await.unwrap();
    let short = open_url(&format!("{}/SHORT", nt.server.url()), Access::Create).await.unwrap();
    for err in [
        short.acquire("x", "a", Duration::from_secs(1)).await.unwrap_err(),
        short.longest_ttl(DEFAULT_TTL).await.unwrap_err(),
    ] {
        assert_eq!(err.kind, ErrorKind::Unfit, "{}", err.message);
        assert!(err.message.contains("\"SHORT\"") && err.message.contains("from 4s to 1h"), "{}", err.message);
    }

    // A bucket that never expires anything cannot hold leases.
    js.create_key_value(kv::Config { bucket: "FOREVER".into(), history: 1, ..Default::default() }).await.unwrap();
    let forever = open_url(&format!("{}/FOREVER", nt.server.url()), Access::Create).await.unwrap();
    let err = forever.acquire("x", "a", TTL).await.expect_err("no expiry");
    assert_eq!(err.kind, ErrorKind::Unfit, "{}", err.message);
    assert!(err.message.contains("never expire"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_longest_ttl_is_one_choria_interval_and_200ms() {
    let nt = nt().await;
    let max_age = Duration::from_millis(4500);
    nt.server.choria_bucket_with_max_age(max_age).await;
    let store = open_url(&format!("{}/CHORIA_LEADER_ELECTION", nt.server.url()), Access::Create).await.unwrap();
    let longest = Duration::from_millis(3575); // 0.75 x 4.5 s + 200 ms
    assert_eq!(store.longest_ttl(DEFAULT_TTL).await.unwrap(), Some(longest));
    // That long is kept; a ms longer a Choria standby could start before the holder's deadline.
    let lease = won(&*store, "my_app", "a", longest).await;
    assert_eq!(store.renew(&lease, longest).await.unwrap(), Renew::Renewed);
    let err = store.acquire("other", "a", longest + Duration::from_millis(1)).await.expect_err("over the limit");
    assert_eq!(err.kind, ErrorKind::Unfit, "{}", err.message);
    assert!(err.message.contains("Choria standby") && !err.message.contains('\n'), "{}", err.message);

    // leaderrun's own bucket has per-message TTL and no max age: no limit.
    let own = nt.open().await;
    assert_eq!((own.longest_ttl(DEFAULT_TTL).await.unwrap(), own.longest_keep().await.unwrap()), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leaderrun_bucket_expires_leases_with_a_per_message_ttl() {
    let nt = nt().await;
    let store = nt.open().await;
    let js = nt.server.jetstream().await;
    let info = js.get_stream("KV_leaderrun").await.unwrap().cached_info().config.clone();
    assert!(info.allow_message_ttl && info.subject_delete_marker_ttl.is_some(), "{info:?}");
    assert_eq!((info.max_messages_per_subject, info.max_age), (1, Duration::ZERO));

    // An expiry leaves a marker, which wakes a waiter.
    let lock = unique("ttl");
    let first = won(&*store, &lock, "a", Duration::from_secs(1)).await;
    let waiter = {
        let (store, lock) = (nt.open().await, lock.clone());
        tokio::spawn(async move { store.changed(&lock, Duration::from_secs(3600)).await })
    };
    tokio::time::timeout(SOON, waiter).await.expect("an expiry never woke the waiter").unwrap();
    let second = won(&*store, &lock, "b", TTL).await;
    assert!(second.token > first.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_and_list_need_no_bucket_and_create_none() {
    let nt = nt().await;
    let store = open_url(&format!("{}/NOT_YET", nt.server.url()), Access::Existing).await.unwrap();
    assert!(!store.status("x").await.unwrap().is_held());
    assert!(store.list().await.unwrap().is_empty());
    assert!(store.revoke("x").await.unwrap().is_none());
    let js = nt.server.jetstream().await;
    assert!(js.get_stream("KV_NOT_YET").await.is_err(), "status, list and revoke create no bucket");
    // A run creates it; the same lookups now see its lock.
    let runner = open_url(&format!("{}/NOT_YET", nt.server.url()), Access::Create).await.unwrap();
    won(&*runner, "x", "a", TTL).await;
    assert_eq!(store.status("x").await.unwrap().holder.as_deref(), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_that_are_not_nats_keys_are_encoded() {
    let nt = nt().await;
    let store = nt.open().await;
    let js = nt.server.jetstream().await;
    let kv = js.get_key_value("leaderrun").await.unwrap();
    won(&*store, "plain_name-1.x", "a", TTL).await;
    assert_eq!(&kv.get("plain_name-1.x").await.unwrap().unwrap()[..], b"a", "a valid key is used verbatim");
    for name in ["with space", "=starts-with-equals", "a..b", "ünï *>", "x."] {
        won(&*store, name, "b", TTL).await;
        assert_eq!(store.status(name).await.unwrap().holder.as_deref(), Some("b"), "{name:?}");
    }
    let listed: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    for name in ["plain_name-1.x", "with space", "=starts-with-equals", "a..b", "ünï *>", "x."] {
        assert!(listed.iter().any(|l| l == name), "{name:?} missing from {listed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_went_wrong_without_the_password() {
    let nt = nt().await;
    let port = nt.server.port();
    let password = nt.server.password().to_string();
    let check = |err: StoreError, kind: ErrorKind, needle: &str, secret: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(err.message.contains("***") && !err.message.contains(secret), "{}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let wrong = format!("nats://{USER}:not-the-password@127.0.0.1:{port}");
    let err = open_url(&wrong, Access::Create).await.err().unwrap();
    check(err, ErrorKind::Refused, "authorization violation", "not-the-password");
    let token = format!("nats://Secret-Token-42@127.0.0.1:{port}");
    check(open_url(&token, Access::Create).await.err().unwrap(), ErrorKind::Refused, "***@", "Secret-Token-42");

    let closed = servers::free_port();
    let url = format!("nats://{USER}:{password}@127.0.0.1:{closed}");
    check(
        open_url(&url, Access::Create).await.err().unwrap(),
        ErrorKind::Unavailable,
        &format!(":{closed}"),
        &password,
    );

    // A bad bucket name or parameter is bad usage, found before anything connects.
    for (bad, needle) in
        [("/no.dots.allowed", "bucket name"), ("?replicas=many", "?replicas=many"), ("?tls=on", "?tls=on")]
    {
        let err = registry::parse_url(&format!("nats://{USER}:{password}@127.0.0.1:{port}{bad}")).unwrap_err();
        assert!(err.contains(needle) && err.contains("***") && !err.contains(&password), "{err}");
        assert!(!err.contains('\n'), "one line: {err:?}");
    }
    // A file a parameter names is read when the store opens.
    let bad = format!("nats://{USER}:{password}@127.0.0.1:{port}?creds=/nonexistent/user.creds");
    check(open_url(&bad, Access::Create).await.err().unwrap(), ErrorKind::Refused, "user.creds", &password);

    let choria = format!("nats://{USER}:{password}@127.0.0.1:{port}/CHORIA_LEADER_ELECTION");
    check(open_url(&choria, Access::Create).await.err().unwrap(), ErrorKind::Refused, "Choria's to create", &password);

    // A server that goes away under an open client: transient.
    let store = nt.open().await;
    nt.server.stop();
    let err = store.status("x").await.expect_err("the server is down");
    check(err, ErrorKind::Unavailable, &format!(":{port}"), &password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leaderrun_holder_and_a_choria_campaigner_never_both_win() {
    let nt = nt().await;
    let choria = nt.server.choria_bucket().await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let mut tasks = Vec::new();
    for i in 0..10 {
        let store = open_url(&url, Access::Create).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let acquired = store.acquire("race", &format!("leaderrun-{i}"), CHORIA_TTL).await.unwrap();
            matches!(acquired, Acquire::Won(_) | Acquire::Confirm { .. })
        }));
    }
    for i in 0..10 {
        let choria = choria.clone();
        tasks.push(tokio::spawn(async move { choria.create("race", format!("choria-{i}").into()).await.is_ok() }));
    }
    let mut winners = 0;
    for task in tasks {
        winners += task.await.unwrap() as usize;
    }
    assert_eq!(winners, 1, "exactly one of leaderrun and Choria campaigners must win");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let certs = servers::tls::Certs::new();
    let server = Nats::start_with(&format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n}}",
        certs.server_cert(),
        certs.server_key(),
        certs.ca()
    ));
    let url = format!(
        "{}/secure?tlsca={}&tlscert={}&tlskey={}",
        server.url(),
        certs.ca().display(),
        certs.client_cert().display(),
        certs.client_key().display()
    );
    let store = open_url(&url, Access::Create).await.expect("TLS with the private CA and a client certificate");
    let lease = won(&*store, "tls", "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);

    // Without the private CA the server's certificate is not trusted: refused, not retried.
    let untrusted = format!("{}/secure?tls=1", server.url());
    let err = open_url(&untrusted, Access::Create).await.err().expect("an untrusted server certificate");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(!err.message.contains(server.password()) && !err.message.contains('\n'), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_authenticates_and_never_shows() {
    let server = Nats::start_with_token();
    let store = open_url(&server.url(), Access::Create).await.expect("a token in the URL");
    won(&*store, "token", "a", TTL).await;
    let wrong = server.url().replace(server.password(), "Wrong-Token-42");
    let err = open_url(&wrong, Access::Create).await.err().expect("a wrong token");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("***@") && !err.message.contains("Wrong-Token-42"), "{}", err.message);
}

/// A waiting standby keeps one watch across `changed` calls: after the first wait (watch and
/// read) nothing is sent while the lock stays held, the holder's renewals included; a release
/// still wakes it. In leaderrun's own bucket the store says it sees expiries.
#[tokio::test]
async fn an_idle_standby_keeps_one_watch_and_sends_nothing() {
    let (requests, _counting) = count_requests();
    let nt = nt().await;
    assert!(nt.open().await.sees_expiry(), "leaderrun's bucket leaves expiry markers");
    conformance::an_idle_standby_sends_nothing(&nt, &requests).await;
}

/// `leaderrun watch` keeps one KV watch on the key: it sees every write and the server's expiry
/// markers, asks nothing while nothing changes, and stays out of the waiters' queue group.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = count_requests();
    let nt = nt().await;
    assert_eq!(nt.open().await.observing(), Observing::Pushes, "leaderrun's bucket leaves expiry markers");
    conformance::a_watcher_sees_changes_and_takes_no_turn(&nt, &requests).await;
}

/// In a Choria bucket a watcher sees a Choria leader's every write (its campaign's updates
/// too) and its evict. An expiry there leaves no marker (a max age), so it says PushesWrites:
/// `watch` reads again when the lease it saw would lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_in_a_choria_bucket_sees_a_choria_leaders_writes() {
    let nt = nt().await;
    let choria = nt.server.choria_bucket_with_max_age(CHORIA_MAX_AGE).await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let watcher = open_url(&url, Access::Existing).await.unwrap();
    assert_eq!(watcher.observing(), Observing::PushesWrites);
    let sees = |what: &'static str| {
        let watcher = watcher.clone();
        tokio::spawn(async move {
            assert!(!watcher.status("my_app").await.unwrap().revoked);
            tokio::time::timeout(SOON, watcher.observe_change("my_app", Duration::from_secs(3600)))
                .await
                .unwrap_or_else(|_| panic!("the watcher never saw {what}"));
        })
    };
    let seen = sees("the create");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revision = choria.create("my_app", "choria-a".into()).await.unwrap();
    seen.await.unwrap();
    let status = watcher.status("my_app").await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("choria-a"), revision));
    assert!(status.campaigner.is_some() && !status.kept);
    let seen = sees("the campaign's update");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renewed = choria.update("my_app", "choria-a".into(), revision).await.unwrap();
    seen.await.unwrap();
    assert_eq!(watcher.status("my_app").await.unwrap().token, renewed);
    let seen = sees("the evict");
    tokio::time::sleep(Duration::from_millis(300)).await;
    choria.delete("my_app").await.unwrap();
    seen.await.unwrap();
    assert!(!watcher.status("my_app").await.unwrap().is_held());
}

/// A holder that dies without releasing (nothing renews its entry): the standby's kept watch
/// sees the server's expiry marker, and the standby takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_when_a_dead_holders_entry_expires() {
    let nt = nt().await;
    let (a, b) = (nt.open().await, nt.open().await);
    let lock = unique("dead-holder");
    let first = won(&*a, &lock, "a", Duration::from_secs(2)).await;
    drop(a);
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_millis(100)).await;
    tokio::time::timeout(SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the expiry wakes the standby");
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token);
}

/// A one-shot run's release expects the message its acquire wrote: one request, no read.
#[tokio::test]
async fn a_release_of_an_unchanged_lease_is_one_request() {
    let (requests, _counting) = count_requests();
    let nt = nt().await;
    let (a, b) = (nt.open().await, nt.open().await);
    let lock = unique("one-shot");
    let before = requests.count();
    let lease = won(&*a, &lock, "a", TTL).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(requests.count() - before, 3, "read, write, delete");
    // A revoked lease has changed under its holder: the release reads, then frees it.
    let lease = won(&*a, &lock, "a", TTL).await;
    assert!(b.revoke(&lock).await.unwrap().is_some());
    a.release(&lease, Duration::ZERO).await.unwrap();
    assert!(!b.status(&lock).await.unwrap().is_held());
}

/// The waiters' queue group on a lock's key, as the store names it (a test's stand-in for a
/// waiter joins it to be chosen and never act).
const QUEUE_GROUP: &str = "leaderrun";

fn key_subject(lock: &str) -> String {
    format!("$KV.leaderrun.{lock}")
}

/// Every message the subscriptions have been given so far (`flushed` first: a round trip
/// to the server, which sends what it delivered before its answer).
async fn given(client: &async_nats::Client, members: &mut [async_nats::Subscriber]) -> Vec<async_nats::Message> {
    use futures_util::{FutureExt, StreamExt};
    client.flush().await.expect("flush");
    let mut messages = Vec::new();
    for member in members {
        while let Some(Some(message)) = member.next().now_or_never() {
            messages.push(message);
        }
    }
    messages
}

fn header(message: &async_nats::Message, name: &str) -> Option<String> {
    message.headers.as_ref()?.get(name).map(|v| v.as_str().to_string())
}

/// What the wake-ups rest on, checked against the server: a JetStream publish on a key's
/// subject (an acquire, a release's delete) reaches exactly one member of a core queue group
/// on that subject, and a delete names the message it deletes; the marker the server leaves
/// when a per-message TTL runs out reaches none (only a KV watch shows it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_reaches_one_queue_member_and_an_expiry_none() {
    use futures_util::StreamExt;
    let nt = nt().await;
    let store = nt.open().await;
    let js = nt.server.jetstream().await;
    let client = js.client();
    let lock = unique("queue");
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(client.queue_subscribe(key_subject(&lock), QUEUE_GROUP.into()).await.unwrap());
    }
    client.flush().await.unwrap();
    let mut watch = js.get_key_value("leaderrun").await.unwrap().watch(&lock).await.unwrap();

    let lease = won(&*store, &lock, "a", TTL).await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    let messages = given(&client, &mut members).await;
    let mut operations: Vec<_> = messages.iter().map(|m| header(m, "KV-Operation")).collect();
    operations.sort();
    assert_eq!(operations, [None, Some("DEL".to_string())], "the acquire and the delete, each to one member");
    let delete = messages.iter().find(|m| header(m, "KV-Operation").is_some()).unwrap();
    let expected = header(delete, "Nats-Expected-Last-Subject-Sequence");
    assert_eq!(expected, Some(lease.token.to_string()), "a release's delete names the message it deletes");

    won(&*store, &lock, "b", Duration::from_secs(1)).await;
    let expired = tokio::time::timeout(SOON, async {
        while let Some(entry) = watch.next().await {
            if entry.unwrap().operation == kv::Operation::Purge {
                return;
            }
        }
    });
    expired.await.expect("the entry expires, and the watch shows its marker");
    let messages = given(&client, &mut members).await;
    assert_eq!(messages.len(), 1, "b's acquire, and no expiry marker: {messages:?}");
    assert_eq!(header(&messages[0], "Nats-Marker-Reason"), None);
}

/// Take the lock as a waiting run does: acquire, and wait for a change whenever it is held.
async fn take_when_free(store: &dyn Store, lock: &str, identity: &str) -> leaderrun::store::Lease {
    loop {
        match store.acquire(lock, identity, TTL).await.expect("acquire") {
            Acquire::Won(lease) => return lease,
            Acquire::Held(_) => store.changed(lock, Duration::from_secs(3600)).await,
            other => panic!("{identity}: unexpected {other:?}"),
        }
    }
}

/// The waiters take turns: a release is taken by the waiter the queue group chose, the others
/// stay quiet, so a handoff costs a few requests however many wait (about 74 before).
#[tokio::test]
async fn a_hundred_waiters_each_get_their_turn_once() {
    let (requests, _counting) = count_requests();
    conformance::a_hundred_waiters_take_turns(&nt().await, &requests, 2.0..10.0).await;
}

/// A waiter the queue group chooses but that never acts (a process stopped with SIGSTOP: its
/// connection stays up and the server keeps choosing it) costs the others one stagger: the
/// live waiter still takes every release. Rounds go on until the frozen one was chosen at
/// least once (each release, one chance in two).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_waiter_chosen_for_a_release_does_not_stall_the_others() {
    let nt = nt().await;
    let (holder, waiter) = (nt.open().await, nt.open().await);
    let lock = unique("frozen");
    let client = nt.server.jetstream().await.client();
    let mut frozen = [client.queue_subscribe(key_subject(&lock), QUEUE_GROUP.into()).await.unwrap()];
    let mut frozen_chosen = 0;
    for _ in 0..20 {
        let lease = won(&*holder, &lock, "holder", TTL).await;
        held(&*waiter, &lock, "waiter").await;
        // The waiter's watch and queue subscription are open (the wait runs out: the lock is held).
        waiter.changed(&lock, Duration::from_millis(500)).await;
        holder.release(&lease, Duration::ZERO).await.unwrap();
        let taken = tokio::time::timeout(SOON, take_when_free(&*waiter, &lock, "waiter")).await;
        let next = taken.expect("the live waiter never took the released lock");
        assert!(next.token > lease.token);
        waiter.release(&next, Duration::ZERO).await.unwrap();
        let deleted = lease.token.to_string();
        let to_frozen = given(&client, &mut frozen).await;
        if to_frozen.iter().any(|m| header(m, "Nats-Expected-Last-Subject-Sequence") == Some(deleted.clone())) {
            frozen_chosen += 1;
            if frozen_chosen == 2 {
                return;
            }
        }
    }
    panic!("the frozen waiter was chosen {frozen_chosen} times in 20 releases");
}

/// A lone waiter is always the one chosen: the release wakes it at once, and its acquire
/// expects the delete marker its watch showed: one publish, no read. A waiter whose race was
/// lost (another took the lock between its wake and its acquire) is refused, reads, and
/// reports the new holder.
#[tokio::test]
async fn a_waiters_acquire_after_a_wake_is_one_request() {
    let (requests, _counting) = count_requests();
    let nt = nt().await;
    let (a, b, c) = (nt.open().await, nt.open().await, nt.open().await);
    let lock = unique("wake");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_millis(500)).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, b.changed(&lock, Duration::from_secs(3600))).await.expect("the release wakes b");
    let before = requests.count();
    let taken = won(&*b, &lock, "b", TTL).await;
    assert_eq!(requests.count() - before, 1, "a publish expecting the marker, no read");

    b.release(&taken, Duration::ZERO).await.unwrap();
    let lease = won(&*c, &lock, "c", TTL).await;
    held(&*a, &lock, "a").await;
    a.changed(&lock, Duration::from_millis(500)).await;
    c.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, a.changed(&lock, Duration::from_secs(3600))).await.expect("the release wakes a");
    let lease = won(&*c, &lock, "c", TTL).await;
    let before = requests.count();
    match a.acquire(&lock, "a", TTL).await.unwrap() {
        Acquire::Held(record) => assert_eq!(record.holder.as_deref(), Some("c")),
        other => panic!("a lost the race to c: {other:?}"),
    }
    assert_eq!(requests.count() - before, 2, "a refused publish, then a read");
    // The next acquire is a plain one: a read, no publish.
    held(&*a, &lock, "a").await;
    assert_eq!(requests.count() - before, 3);
    c.release(&lease, Duration::ZERO).await.unwrap();
}

/// A NATS user that may not subscribe to the bucket's subjects (only to its inboxes, which
/// the watch and replies use): its waiters are in no queue group, are never chosen, and take
/// a released lock after a stagger. Its subscription is refused asynchronously: an idle
/// standby still sends nothing, and nothing fails.
#[tokio::test]
async fn a_user_without_subscribe_permission_on_the_bucket_still_gets_the_lock() {
    let (requests, _counting) = count_requests();
    let server = Nats::start_with(
        "authorization {\n  users: [ { user: limited, password: Limited-Pass-1, permissions: { subscribe: { deny: \
         [\"$KV.>\"] } } } ]\n}",
    );
    let limited = Limited { url: format!("nats://limited:Limited-Pass-1@127.0.0.1:{}", server.port()) };
    conformance::an_idle_standby_sends_nothing(&limited, &requests).await;

    // The server does refuse this user's queue subscription (as an asynchronous error).
    let (refusals, mut refused) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password("limited".into(), "Limited-Pass-1".into())
        .event_callback(move |event| {
            let refusals = refusals.clone();
            async move {
                let _ = refusals.send(event.to_string().to_lowercase());
            }
        })
        .connect(format!("127.0.0.1:{}", server.port()))
        .await
        .expect("the limited user connects");
    let _queue = client.queue_subscribe(key_subject("x"), QUEUE_GROUP.into()).await.unwrap();
    client.flush().await.unwrap();
    let violation = async {
        while let Some(event) = refused.recv().await {
            if event.contains("permissions violation") {
                return;
            }
        }
    };
    tokio::time::timeout(SOON, violation).await.expect("the queue subscription is refused");
}

/// Stores of a user whose permissions leave out subscribing to the bucket's subjects.
struct Limited {
    url: String,
}

#[async_trait]
impl Harness for Limited {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.url, Access::Create).await.expect("open the NATS store as the limited user")
    }

    async fn restart(&self) {
        unreachable!("not restarted")
    }
}
