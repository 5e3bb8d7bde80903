//! What every store on the client-timed core (S3, DynamoDB, Cloud Storage, Datastore) shows
//! against its server beyond the conformance suite, written once: the guarded writes its
//! safety rests on (each would go through on a server that ignored the guard), racing
//! creates and replaces, tokens that outlive a deleted record, the overlap a deletion by hand
//! allows, a silent holder taken over after one observation, a server restart, `leaderrun
//! watch`, and an unreachable server. `client_timed_suite!` runs them all in a store's test
//! file, which keeps only what that store alone has. Also a tiny HTTP server (`fake_http`),
//! for the refusals each store tests against a server that misbehaves.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leaderrun::store::client_timed::{Created, Record, Records, Version, Written};
use leaderrun::store::{Acquire, Renew, Store, StoreError};

use crate::conformance::{self, held, unique, won, Harness, TTL};
use crate::servers::TestServer;

/// A client-timed store's test server, as the shared tests need it.
#[async_trait]
pub trait RecordsHarness: Harness {
    type Records: Records + 'static;
    /// A client of the store's records, for tests of one request at a time.
    async fn records(&self) -> Self::Records;
    /// Delete the lock's record behind everyone's back, as the store's own tool does.
    async fn delete(&self, lock: &str);
    type Server: TestServer;
    /// The test server (stopped and started again by `a_client_rides_out_a_server_restart`).
    fn server(&self) -> &Self::Server;
    /// The store opened at a loopback `port` where nothing listens, and the URL its errors
    /// must name.
    async fn open_unreachable(port: u16) -> (String, Result<Box<dyn Store>, StoreError>);
}

/// A record as the tests write it.
pub fn record(holder: &str, token: u64) -> Record {
    Record { holder: holder.into(), ttl_seconds: 30, token: Some(token), ..Record::default() }
}

/// What the store's safety rests on, one request at a time: each of these would be `Done` on
/// a server that ignored the store's guard (If-None-Match and If-Match, condition
/// expressions, ifGenerationMatch, an insert's existence check and `baseVersion`).
pub async fn a_create_over_a_record_and_a_stale_replace_are_refused<H: RecordsHarness>(h: &H) {
    let (a, b) = (h.records().await, h.records().await);
    let lock = unique("guards");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    assert_eq!(b.create(&lock, &record("b", 2)).await.unwrap(), Created::Moved, "a create over a record");
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    assert_ne!(first, second, "every write changes the version");
    assert_eq!(a.replace(&lock, &record("a", 3), &first).await.unwrap(), Written::Moved, "a stale version");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b", "the stale replace wrote nothing");
    // The same record written again still changes the version (a write counter, a new
    // generation, a fresh version attribute, a nonce).
    let Written::Done(third) = b.replace(&lock, &record("b", 2), &second).await.unwrap() else { panic!("rewrite") };
    assert_ne!(second, third, "the same record written twice must change the version");
    // Deleted behind everyone's back: a replace finds nothing to replace, and does not make it.
    h.delete(&lock).await;
    assert_eq!(b.replace(&lock, &record("b", 4), &third).await.unwrap(), Written::Moved, "a deleted record");
    assert!(a.read(&lock).await.unwrap().found.is_none());
}

/// Ten writes at once, each by its own client, after a barrier: the versions written.
async fn race<R, F, Fut>(clients: &[Arc<R>], write: F) -> Vec<Version>
where
    R: Records + 'static,
    F: Fn(Arc<R>, usize) -> Fut,
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

/// Of ten creates of one lock at once exactly one wins, and of ten replaces from one version
/// exactly one: if a guard (or a transaction) were ignored, several would.
pub async fn of_racing_creates_and_replaces_exactly_one_wins<H: RecordsHarness>(h: &H) {
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(Arc::new(h.records().await));
    }
    for round in 0..3 {
        let lock = unique("race");
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
        assert_eq!(created.len(), 1, "round {round}: exactly one create of ten may succeed");
        let replaced = race(&clients, |c, i| {
            let (lock, base) = (lock.clone(), created[0].clone());
            async move { c.replace(&lock, &record(&format!("r{i}"), 2), &base).await.unwrap() }
        })
        .await;
        assert_eq!(replaced.len(), 1, "round {round}: exactly one replace of ten at one version may succeed");
    }
}

/// No counter outlives a record (S3, DynamoDB, Cloud Storage follow the server's clock;
/// Datastore's lookup reports a version it never lowers, also for a missing entity): a token
/// taken after the record was deleted (even within the same second) is still larger, and a
/// create that lands late is told a floor above every token handed out.
pub async fn tokens_outlive_a_deleted_record<H: RecordsHarness>(h: &H) {
    let store = h.open().await;
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        for i in 0..4 {
            let lease = won(&*store, &lock, &format!("h{round}-{i}"), TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        h.delete(&lock).await;
        assert_eq!(store.status(&lock).await.unwrap().token, 0, "the record and its token are gone");
        // A create that lands now with a token from a read made before all of that (a slow
        // network, a paused host) is told a floor above every token handed out: the core
        // then raises its token before it counts.
        let late = h.records().await.create(&lock, &record("late", 1)).await.unwrap();
        let Created::Done { floor, .. } = late else { panic!("a create on an empty name") };
        assert!(floor >= last, "round {round}: a late create's floor {floor} is below token {last}");
        h.delete(&lock).await;
    }
}

/// Deleting a held lock's record by hand (`aws s3 rm`, `aws dynamodb delete-item`, `gcloud
/// storage rm`, a Datastore delete) is not a way to free it: a standby takes the lock at
/// once, while the holder learns only at its next renewal, so two children may run until
/// then (each store's page says so; `leaderrun release` is the way:
/// `revoked_holder_sees_it_at_the_next_renewal`). Shown here: the standby wins before the
/// holder has renewed, with a larger token, and that renewal then reports the lease lost.
pub async fn deleting_the_record_lets_a_standby_in_before_its_holder_learns<H: RecordsHarness>(h: &H) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("rm");
    let first = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    h.delete(&lock).await;
    // The overlap: b holds it while a, which has not renewed since, still runs its child.
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token, "only the fencing token tells the two apart");
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the holder learns at its next renewal");
}

/// A one-shot run's first look at a held lock is not proof its holder lives; after one
/// observation without a change, the lock is taken (client-timed, on this host's clock).
pub async fn a_silent_holder_is_taken_over_after_one_observation<H: RecordsHarness>(h: &H) {
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

/// Nothing listens: an outage (retried), in one line naming the store's URL.
pub async fn an_unreachable_server_is_an_outage<H: RecordsHarness>() {
    let (url, opened) = H::open_unreachable(crate::servers::free_port()).await;
    let err = opened.err().expect("nothing listens");
    assert!(err.is_transient(), "{}", err.message);
    assert!(err.message.contains(&url) && !err.message.contains('\n'), "{:?}", err.message);
}

/// A store's part of the conformance suite and of this one, for `$harness` (an expression
/// that makes one, awaited) of type `$ty`.
#[macro_export]
macro_rules! client_timed_suite {
    ($ty:ty, $harness:expr) => {
        $crate::client_timed_suite!(@tests $harness;
            a_create_over_a_record_and_a_stale_replace_are_refused,
            of_racing_creates_and_replaces_exactly_one_wins,
            tokens_outlive_a_deleted_record,
            deleting_the_record_lets_a_standby_in_before_its_holder_learns,
            a_silent_holder_is_taken_over_after_one_observation,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_client_rides_out_a_server_restart() {
            use client_timed::RecordsHarness;
            let h = $harness.await;
            let server = h.server();
            conformance::a_client_rides_out_a_server_restart(&h, || server.stop(), || server.start_again()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn an_unreachable_server_is_an_outage() {
            client_timed::an_unreachable_server_is_an_outage::<$ty>().await;
        }

        /// `leaderrun watch` on this store (it polls), and a standby still gets its turn. On a
        /// current-thread runtime, so that the requests counted are its own.
        #[tokio::test]
        async fn a_watcher_sees_changes_and_takes_no_turn() {
            let (requests, _counting) = conformance::count_requests();
            conformance::a_watcher_sees_changes_and_takes_no_turn(&$harness.await, &requests).await;
        }
    };
    (@tests $harness:expr; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                client_timed::$name(&$harness.await).await;
            }
        )*
    };
}

/// What `fake_http` answers: the status line's code and reason (`200 OK`), header lines
/// (each ending in CRLF; Content-Length is added), and the body.
pub struct Reply {
    pub status: String,
    pub headers: String,
    pub body: String,
}

impl Reply {
    /// A JSON body, with its Content-Type.
    pub fn json(status: &str, content_type: &str, body: impl Into<String>) -> Self {
        Reply { status: status.into(), headers: format!("Content-Type: {content_type}\r\n"), body: body.into() }
    }
}

/// A tiny HTTP/1.1 server on loopback that answers every request with `answer(path)`, for a
/// server that misbehaves (ignores preconditions, shows a global table, refuses). Its address,
/// `127.0.0.1:PORT`.
pub fn fake_http(answer: fn(&str) -> Reply) -> String {
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
                    if line != "\r\n" {
                        return;
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply = answer(request.split_whitespace().nth(1).unwrap_or_default());
                    let message = format!(
                        "HTTP/1.1 {}\r\n{}Content-Length: {}\r\n\r\n{}",
                        reply.status,
                        reply.headers,
                        reply.body.len(),
                        reply.body
                    );
                    if stream.write_all(message.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    host
}
