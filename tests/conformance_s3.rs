//! The conformance suite against moto's S3 (one server per test), through the client-timed
//! core; and what only this store has: its preconditions (tests that fail if a server
//! ignored them), tokens that outlive a deleted object, object keys, refusals in one line
//! without the secret, and the check that refuses a server which ignores preconditions.
//!
//! `leases_survive_a_restart` runs too: moto keeps its objects in memory, but the test
//! server records every request and replays them into the restarted process (see
//! tests/servers/moto.rs), which rebuilds each object with the same body and so the same ETag.

mod conformance;
mod servers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, TTL};
use leaderrun::store::client_timed::{Created, Record, Records, Written};
use leaderrun::store::s3::{open_with, ConfigLoader, S3Records, Target};
use leaderrun::store::Access;
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use servers::moto::{Moto, BUCKET, REGION};

struct S3Harness {
    server: Moto,
}

async fn s3() -> S3Harness {
    S3Harness { server: tokio::task::spawn_blocking(Moto::start).await.unwrap() }
}

/// Point the SDK's loader at `endpoint` with `key`: in-process clients cannot each have an
/// environment of their own (the end-to-end tests set AWS_* variables instead).
fn configured(endpoint: String, key: (String, String)) -> impl FnOnce(ConfigLoader) -> ConfigLoader {
    move |loader| {
        let credentials = aws_sdk_s3::config::Credentials::new(key.0, key.1, None, None, "test");
        loader.endpoint_url(endpoint).credentials_provider(credentials).region(aws_sdk_s3::config::Region::new(REGION))
    }
}

fn key_of(server: &Moto) -> (String, String) {
    let (id, secret) = server.key();
    (id.to_string(), secret.to_string())
}

async fn open_url(server: &Moto, url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid URL");
    open_with(&target, access, configured(server.endpoint(), key_of(server))).await.map(Arc::from)
}

async fn records(server: &Moto) -> S3Records {
    let target = Target::parse(&server.url()).unwrap();
    S3Records::open_with(&target, Access::Create, configured(server.endpoint(), key_of(server))).await.unwrap()
}

/// A plain SDK client of the test server, for what another tool would do to the bucket.
async fn sdk(server: &Moto) -> aws_sdk_s3::Client {
    let loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(aws_smithy_http_client::Builder::new().build_http());
    let loader = configured(server.endpoint(), key_of(server))(loader);
    let shared = loader.load().await;
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&shared).force_path_style(true).build())
}

#[async_trait]
impl Harness for S3Harness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server, &self.server.url(), Access::Create).await.expect("open the s3 store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(s3());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = s3().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

fn record(holder: &str, token: u64) -> Record {
    Record { holder: holder.into(), ttl_seconds: 30, token: Some(token), ..Record::default() }
}

/// What the store's safety rests on, one request at a time: each of these would be
/// `Done` on a server that ignored If-None-Match or If-Match.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_over_an_object_and_a_stale_replace_are_refused() {
    let server = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let (a, b) = (records(&server).await, records(&server).await);
    let lock = unique("preconditions");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    assert_eq!(b.create(&lock, &record("b", 2)).await.unwrap(), Created::Moved, "If-None-Match: * ignored");
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    assert_ne!(first, second, "every write changes the version");
    assert_eq!(a.replace(&lock, &record("a", 3), &first).await.unwrap(), Written::Moved, "a stale If-Match ignored");
    // The same record written again still changes the version (the write counter).
    let Written::Done(third) = b.replace(&lock, &record("b", 2), &second).await.unwrap() else { panic!("rewrite") };
    assert_ne!(second, third, "the same record written twice must change the ETag");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b");
    // Deleted behind everyone's back: a replace finds nothing to replace.
    sdk(&server).await.delete_object().bucket(BUCKET).key(format!("leaderrun/{lock}")).send().await.unwrap();
    assert_eq!(
        b.replace(&lock, &record("b", 4), &third).await.unwrap(),
        Written::Moved,
        "If-Match on a deleted object"
    );
    assert!(a.read(&lock).await.unwrap().found.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_racing_creates_exactly_one_wins() {
    let server = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let lock = unique("race");
    let barrier = Arc::new(tokio::sync::Barrier::new(10));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (records, lock, barrier) = (records(&server).await, lock.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            records.create(&lock, &record(&format!("c{i}"), 1)).await.unwrap()
        }));
    }
    let mut done = 0;
    for task in tasks {
        if let Created::Done { .. } = task.await.unwrap() {
            done += 1;
        }
    }
    assert_eq!(done, 1, "exactly one create of ten may succeed");
}

/// S3 keeps no counter beyond an object's life: tokens follow the server's clock, so one
/// taken after the object was deleted (even within the same second) is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_outlive_a_deleted_object() {
    let server = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let (store, client) = (open_url(&server, &server.url(), Access::Create).await.unwrap(), sdk(&server).await);
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        for i in 0..5 {
            let lease = won(&*store, &lock, &format!("h{round}-{i}"), TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        client.delete_object().bucket(BUCKET).key(format!("leaderrun/{lock}")).send().await.unwrap();
        assert_eq!(store.status(&lock).await.unwrap().token, 0, "the object and its token are gone");
        // A create that lands now with a token from a read made before all of that (a slow
        // network, a paused host) is told a floor above every token handed out: the core
        // then raises its token before it counts.
        let late = records(&server).await.create(&lock, &record("late", 1)).await.unwrap();
        let Created::Done { floor, .. } = late else { panic!("a create on an empty name") };
        assert!(floor >= last, "round {round}: a late create's floor {floor} is below token {last}");
        client.delete_object().bucket(BUCKET).key(format!("leaderrun/{lock}")).send().await.unwrap();
    }
}

/// Deleting a held lock's object by hand is not a way to free it: a standby takes the lock at
/// once, while the holder learns only at its next renewal, so two children may run until then
/// (the store's page says so; `leaderrun release` is the way:
/// `revoked_holder_sees_it_at_the_next_renewal`). Shown here: the standby wins before the
/// holder has renewed, with a larger token, and that renewal then reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_the_object_lets_a_standby_in_before_its_holder_learns() {
    let h = s3().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("rm");
    let first = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    sdk(&h.server).await.delete_object().bucket(BUCKET).key(format!("leaderrun/{lock}")).send().await.unwrap();
    // The overlap: b holds it while a, which has not renewed since, still runs its child.
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token, "only the fencing token tells the two apart");
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the holder learns at its next renewal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_sit_under_the_prefix_and_list_shows_only_locks() {
    let h = s3().await;
    let store = open_url(&h.server, &format!("{}/team/b", h.server.url()), Access::Create).await.unwrap();
    let lock = format!("a/b %.{}", unique("key"));
    won(&*store, &lock, "a", TTL).await;
    let client = sdk(&h.server).await;
    // Someone else's objects under the prefix are not locks, and do not break the list.
    for key in ["team/b/notes.txt", "team/b/sub/x"] {
        client.put_object().bucket(BUCKET).key(key).body(b"hello".to_vec().into()).send().await.unwrap();
    }
    let listed = client.list_objects_v2().bucket(BUCKET).prefix("team/b/").send().await.unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert!(keys.contains(&format!("team/b/{}", lock.replace('%', "%25").replace('/', "%2F")).as_str()), "{keys:?}");
    assert!(keys.contains(&"team/b/.conditional-write-probe"), "{keys:?}");
    let names: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    assert_eq!(names, vec![lock.clone()]);
    // The default prefix is another set of locks.
    let other = h.open().await;
    won(&*other, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_name_the_bucket_and_operation_in_one_line_without_the_secret() {
    let server = tokio::task::spawn_blocking(Moto::start_with_iam).await.unwrap();
    let (id, secret) = key_of(&server);
    let check = |err: StoreError, operation: &str, secret: &str| {
        assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
        assert!(err.message.contains(&format!("s3://{BUCKET}")) && err.message.contains(operation), "{}", err.message);
        assert!(err.message.contains("403"), "{}", err.message);
        assert!(!err.message.contains(secret) && !err.message.contains('\n'), "{:?}", err.message);
    };
    // The right key works.
    let target = Target::parse(&server.url()).unwrap();
    let right = open_with(&target, Access::Create, configured(server.endpoint(), (id.clone(), secret.clone())))
        .await
        .expect("the right secret");
    let lock = unique("iam");
    let lease = won(&*right, &lock, "a", TTL).await;
    // A wrong secret: refused at the run's first request, and at a status's.
    let wrong = format!("{secret}-wrong");
    let err = open_with(&target, Access::Create, configured(server.endpoint(), (id.clone(), wrong.clone())))
        .await
        .err()
        .expect("a wrong secret is refused");
    check(err, "PutObject", &wrong);
    let looker =
        open_with(&target, Access::Existing, configured(server.endpoint(), (id.clone(), wrong.clone()))).await.unwrap();
    check(looker.status(&lock).await.unwrap_err(), "GetObject", &wrong);
    // A session token never shows either.
    let token = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN";
    let endpoint = server.endpoint();
    let with_token = move |loader: ConfigLoader| {
        let credentials = aws_sdk_s3::config::Credentials::new(id, wrong, Some(token.into()), None, "test");
        loader.endpoint_url(endpoint).credentials_provider(credentials).region(aws_sdk_s3::config::Region::new(REGION))
    };
    let err = open_with(&target, Access::Create, with_token).await.err().expect("refused");
    assert!(!err.message.contains(token), "{}", err.message);
    right.release(&lease, Duration::ZERO).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_bucket_is_refused() {
    let server = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let err = open_url(&server, "s3://no-such-bucket", Access::Create).await.err().expect("refused");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("s3://no-such-bucket") && err.message.contains("NoSuchBucket"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_an_outage() {
    let port = servers::free_port();
    let target = Target::parse("s3://some-bucket").unwrap();
    let key = ("AKIAX".to_string(), "secret-x".to_string());
    let err = open_with(&target, Access::Create, configured(format!("http://127.0.0.1:{port}"), key))
        .await
        .err()
        .expect("nothing listens");
    assert!(err.is_transient(), "{}", err.message);
    assert!(err.message.contains("s3://some-bucket") && !err.message.contains('\n'), "{:?}", err.message);
}

/// A server that answers every PutObject with 200, preconditions or not: two hosts could
/// both "create" a lock. It is refused when a run opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_preconditions_is_refused_at_open() {
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
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply =
                        "HTTP/1.1 200 OK\r\nETag: \"0123456789abcdef0123456789abcdef\"\r\nContent-Length: 0\r\n\r\n";
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let target = Target::parse("s3://careless-bucket").unwrap();
    let err = open_with(&target, Access::Create, configured(endpoint, ("AKIAX".into(), "x".into())))
        .await
        .err()
        .expect("a server that ignores If-Match must be refused");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("ignores If-Match") && !err.message.contains('\n'), "{:?}", err.message);
}

/// A one-shot run's first look at a held lock is not proof its holder lives; after one
/// observation without a change, the lock is taken (client-timed, on this host's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_holder_is_taken_over_after_one_observation() {
    let h = s3().await;
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
    conformance::a_watcher_sees_changes_and_takes_no_turn(&s3().await, &requests).await;
}
