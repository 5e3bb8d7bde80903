//! The conformance suite against a real NATS server with JetStream (one per test, started
//! in a temporary directory), and what only this store has: Choria compatibility (its
//! leader election bucket, its create and evict), error kinds and messages without the
//! password, lock names that are not NATS keys, and riding out a server restart.

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use conformance::{held, unique, won, Harness, SOON, TTL};
use leaderrun::store::url::{open, Access, StoreSpec};
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use servers::nats::{Nats, USER};

struct Nt {
    server: Nats,
}

async fn nt() -> Nt {
    Nt { server: Nats::start() }
}

async fn open_url(url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    open(&StoreSpec::from_url(url).expect("a valid URL"), access).await.map(Arc::from)
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
    let choria = nt.server.choria_bucket().await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let store = open_url(&url, Access::Create).await.unwrap();

    // leaderrun holds my_app: Choria's tools show it as the leader, its campaigners lose.
    let lease = won(&*store, "my_app", "host-a leaderrun", Duration::from_secs(30)).await;
    let value = choria.get("my_app").await.unwrap().expect("the key exists");
    assert_eq!(&value[..], b"host-a leaderrun", "the value is the holder identity, plain");
    assert!(choria.create("my_app", "choria-b".into()).await.is_err(), "a Choria campaigner must not win");
    assert_eq!(store.renew(&lease, Duration::from_secs(30)).await.unwrap(), Renew::Renewed);
    assert_eq!(&choria.get("my_app").await.unwrap().unwrap()[..], b"host-a leaderrun");

    // Choria's evict (deleting the key) makes the holder stand down at its next renewal.
    choria.delete("my_app").await.unwrap();
    assert_eq!(store.renew(&lease, Duration::from_secs(30)).await.unwrap(), Renew::Lost(None));
    assert!(!store.status("my_app").await.unwrap().is_held());

    // A Choria leader shows as the holder and keeps leaderrun out.
    let revision = choria.create("my_app", "choria-c".into()).await.expect("Choria campaigns on a freed key");
    let status = store.status("my_app").await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("choria-c"), revision));
    assert!(status.expires_in.is_some_and(|left| left <= Duration::from_secs(60)), "{status:?}");
    held(&*store, "my_app", "host-d").await;
    assert!(store.list().await.unwrap().iter().any(|r| r.lock == "my_app" && r.holder.as_deref() == Some("choria-c")));

    // Once Choria's leader lets go, leaderrun wins, with a larger token.
    choria.delete("my_app").await.unwrap();
    let next = won(&*store, "my_app", "host-d", Duration::from_secs(30)).await;
    assert!(next.token > revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ttl_above_the_buckets_max_age_is_refused() {
    let nt = nt().await;
    nt.server.choria_bucket().await;
    let url = format!("{}/CHORIA_LEADER_ELECTION", nt.server.url());
    let store = open_url(&url, Access::Create).await.unwrap();
    let err = store.acquire("my_app", "a", Duration::from_secs(90)).await.expect_err("90 s > 60 s max age");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("CHORIA_LEADER_ELECTION") && err.message.contains("1m 30s"), "{}", err.message);
    assert!(err.message.contains("1m") && !err.message.contains('\n'), "{}", err.message);
    assert!(!err.message.contains(nt.server.password()), "{}", err.message);
    // Up to the max age is fine.
    won(&*store, "my_app", "a", Duration::from_secs(60)).await;

    // A bucket that never expires anything cannot hold leases.
    let js = nt.server.jetstream().await;
    js.create_key_value(kv::Config { bucket: "FOREVER".into(), history: 1, ..Default::default() }).await.unwrap();
    let forever = open_url(&format!("{}/FOREVER", nt.server.url()), Access::Create).await.unwrap();
    let err = forever.acquire("x", "a", TTL).await.expect_err("no expiry");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("never expire"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_longest_ttl_is_the_buckets_max_age() {
    let nt = nt().await;
    let max_age = Duration::from_millis(4500);
    nt.server.choria_bucket_with_max_age(max_age).await;
    let store = open_url(&format!("{}/CHORIA_LEADER_ELECTION", nt.server.url()), Access::Create).await.unwrap();
    assert_eq!(store.longest_ttl().await.unwrap(), Some(max_age));
    // That long is kept; a ms longer the server would drop before the holder's deadline.
    let lease = won(&*store, "my_app", "a", max_age).await;
    assert_eq!(store.renew(&lease, max_age).await.unwrap(), Renew::Renewed);
    let err = store.acquire("other", "a", max_age + Duration::from_millis(1)).await.expect_err("over the max age");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("max age") && !err.message.contains('\n'), "{}", err.message);

    // leaderrun's own bucket has per-message TTL and no max age: no limit.
    assert_eq!(nt.open().await.longest_ttl().await.unwrap(), None);
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
        let err = StoreSpec::from_url(&format!("nats://{USER}:{password}@127.0.0.1:{port}{bad}")).unwrap_err();
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
            matches!(store.acquire("race", &format!("leaderrun-{i}"), TTL).await.unwrap(), Acquire::Won(_))
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
