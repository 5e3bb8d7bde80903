//! The conformance suite against moto's DynamoDB (one server per test), through the
//! client-timed core; and what only this store has: its conditions (tests that fail if a
//! server ignored them), tokens that outlive a deleted item, the table's checks (missing,
//! another key, a global table), `leaderrun init`'s table, items of awslabs' lock client,
//! and refusals in one line without the secret.
//!
//! `leases_survive_a_restart` runs too: moto keeps its tables in memory, but the test server
//! records every request and replays them into the restarted process (tests/servers/moto.rs).

mod conformance;
#[path = "../bench/proxy.rs"]
mod proxy;
mod servers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, TTL};
use leaderrun::store::client_timed::{Created, Record, Records, Written};
use leaderrun::store::dynamodb::{open_with, prepare_with, ConfigLoader, DynamoRecords, Target};
use leaderrun::store::{Access, Acquire, ErrorKind, Renew, Store, StoreError};
use servers::moto::REGION;
use servers::moto_dynamodb::{MotoDynamo, TABLE};

struct DynamoHarness {
    server: MotoDynamo,
}

async fn dynamo() -> DynamoHarness {
    DynamoHarness { server: tokio::task::spawn_blocking(MotoDynamo::start).await.unwrap() }
}

/// Point the SDK's loader at `endpoint` with `key`: in-process clients cannot each have an
/// environment of their own (the end-to-end tests set AWS_* variables instead).
fn configured(endpoint: String, key: (String, String)) -> impl FnOnce(ConfigLoader) -> ConfigLoader {
    move |loader| {
        let credentials = aws_sdk_dynamodb::config::Credentials::new(key.0, key.1, None, None, "test");
        loader
            .endpoint_url(endpoint)
            .credentials_provider(credentials)
            .region(aws_sdk_dynamodb::config::Region::new(REGION))
    }
}

fn key_of(server: &MotoDynamo) -> (String, String) {
    let (id, secret) = server.key();
    (id.to_string(), secret.to_string())
}

async fn open_url(server: &MotoDynamo, url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid URL");
    open_with(&target, access, configured(server.endpoint(), key_of(server))).await.map(Arc::from)
}

async fn records(server: &MotoDynamo) -> DynamoRecords {
    let target = Target::parse(&server.url()).unwrap();
    DynamoRecords::open_with(&target, Access::Create, configured(server.endpoint(), key_of(server))).await.unwrap()
}

#[async_trait]
impl Harness for DynamoHarness {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server, &self.server.url(), Access::Create).await.expect("open the dynamodb store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(dynamo());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = dynamo().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

fn record(holder: &str, token: u64) -> Record {
    Record { holder: holder.into(), ttl_seconds: 30, token: Some(token), ..Record::default() }
}

/// What the store's safety rests on, one request at a time: each of these would be `Done`
/// on a server that ignored the condition expressions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_over_an_item_and_a_stale_replace_are_refused() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start).await.unwrap();
    let (a, b) = (records(&server).await, records(&server).await);
    let lock = unique("conditions");
    let Created::Done { version: first, .. } = a.create(&lock, &record("a", 1)).await.unwrap() else {
        panic!("the first create")
    };
    assert_eq!(b.create(&lock, &record("b", 2)).await.unwrap(), Created::Moved, "attribute_not_exists ignored");
    let Written::Done(second) = b.replace(&lock, &record("b", 2), &first).await.unwrap() else {
        panic!("a replace at the current version")
    };
    assert_ne!(first, second, "every write changes the version");
    assert_eq!(a.replace(&lock, &record("a", 3), &first).await.unwrap(), Written::Moved, "a stale version ignored");
    let Written::Done(third) = b.replace(&lock, &record("b", 2), &second).await.unwrap() else { panic!("rewrite") };
    assert_ne!(second, third, "the same record written twice must change the version");
    assert_eq!(a.read(&lock).await.unwrap().found.unwrap().record.holder, "b");
    // Deleted behind everyone's back: a replace finds nothing to replace, and does not make it.
    server.delete_item(&lock);
    assert_eq!(b.replace(&lock, &record("b", 4), &third).await.unwrap(), Written::Moved, "a replace of a deleted item");
    assert!(a.read(&lock).await.unwrap().found.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_racing_creates_exactly_one_wins() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start).await.unwrap();
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

/// DynamoDB keeps no counter beyond an item's life: tokens follow the server's clock, so one
/// taken after the item was deleted (even within the same second) is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_outlive_a_deleted_item() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start).await.unwrap();
    let store = open_url(&server, &server.url(), Access::Create).await.unwrap();
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        for i in 0..5 {
            let lease = won(&*store, &lock, &format!("h{round}-{i}"), TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        server.delete_item(&lock);
        assert_eq!(store.status(&lock).await.unwrap().token, 0, "the item and its token are gone");
        // A create that lands now with a token from a read made before all of that is told a
        // floor above every token handed out: the core then raises its token before it counts.
        let late = records(&server).await.create(&lock, &record("late", 1)).await.unwrap();
        let Created::Done { floor, .. } = late else { panic!("a create on an empty key") };
        assert!(floor >= last, "round {round}: a late create's floor {floor} is below token {last}");
        server.delete_item(&lock);
    }
}

/// Deleting a held lock's item by hand is not a way to free it: a standby takes the lock at
/// once, while the holder learns only at its next renewal, so two children may run until then
/// (the store's page says so; `leaderrun release` is the way:
/// `revoked_holder_sees_it_at_the_next_renewal`). Shown here: the standby wins before the
/// holder has renewed, with a larger token, and that renewal then reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_the_item_lets_a_standby_in_before_its_holder_learns() {
    let h = dynamo().await;
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("rm");
    let first = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    h.server.delete_item(&lock);
    // The overlap: b holds it while a, which has not renewed since, still runs its child.
    let second = won(&*b, &lock, "b", TTL).await;
    assert!(second.token > first.token, "only the fencing token tells the two apart");
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the holder learns at its next renewal");
}

/// An SDK retry of a conditional PutItem that landed but whose answer was lost fails its
/// condition against its own write: the store finds its own new version in the item DynamoDB
/// returns and counts the write as done ("maybe mine"). Without that, the retry's failed
/// condition would read as a lost race, and the run would find its own item held by someone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_put_that_finds_its_own_write_counts_as_won() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start).await.unwrap();
    let moto = server.endpoint().trim_start_matches("http://").parse().expect("host:port");
    let proxy = proxy::Proxy::start(moto).unwrap();
    let target = Target::parse(&server.url()).unwrap();
    let through = format!("http://127.0.0.1:{}", proxy.port());
    let store = open_with(&target, Access::Create, configured(through, key_of(&server))).await.unwrap();
    let lock = unique("retried");
    proxy.drop_response_to("PutItem");
    let lease = won(&*store, &lock, "a", TTL).await;
    // The create, sent again by the SDK (and a third PutItem when the retry's answer came in
    // a later second than the read: the core then raises the token from that second).
    assert_eq!(proxy.responses_dropped(), 1, "the create's answer lost");
    assert!(proxy.requests_matched() >= 2, "the SDK did not send the create again");
    let status = store.status(&lock).await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("a"), lease.token), "one lease, its token written");
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed, "the version it counted is the item's");
}

/// The item as the lock client's readers know it, and what `list` makes of other items.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn items_carry_the_lock_clients_attributes_and_list_shows_only_locks() {
    let h = dynamo().await;
    let store = h.open().await;
    let lock = format!("a/b %.\"{}", unique("key"));
    won(&*store, &lock, "host-a", TTL).await;
    let key = serde_json::to_string(&lock).unwrap();
    let (status, body) =
        h.server.call("GetItem", &format!(r#"{{"TableName":"{TABLE}","Key":{{"key":{{"S":{key}}}}}}}"#));
    assert_eq!(status, 200, "{body}");
    let item: serde_json::Value = serde_json::from_str(&body).unwrap();
    let item = &item["Item"];
    assert_eq!(item["key"]["S"], lock.as_str(), "{item}");
    assert_eq!(item["ownerName"]["S"], "host-a", "{item}");
    assert_eq!(item["leaseDuration"]["S"], "30000", "{item}");
    assert_eq!(item["recordVersionNumber"]["S"].as_str().unwrap().len(), 36, "{item}");
    assert!(item.get("isReleased").is_none() && item["fencingToken"]["N"].is_string(), "{item}");
    // Someone else's item is not a lock, and does not break the list.
    h.server.put_item(r#"{"key":{"S":"notes"},"text":{"S":"hello"}}"#);
    let names: Vec<String> = store.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    assert_eq!(names, vec![lock.clone()]);
}

/// An item awslabs' lock client wrote is a lease like any other: held by its owner for its
/// leaseDuration after it was last seen to change, then taken (with a token of leaderrun's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_clients_item_is_respected_then_taken_after_one_observation() {
    let h = dynamo().await;
    let store = h.open().await;
    let lock = unique("java");
    h.server.put_item(&format!(
        r#"{{"key":{{"S":"{lock}"}},"ownerName":{{"S":"java-host"}},"leaseDuration":{{"S":"1000"}},
            "recordVersionNumber":{{"S":"0b1e9b1c-2d4e-4f50-8a6b-7c8d9e0f1a2b"}},"data":{{"B":"AQI="}}}}"#
    ));
    let status = store.status(&lock).await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("java-host"), 0));
    let decide_in = match store.acquire(&lock, "b", TTL).await.unwrap() {
        Acquire::Unproven { decide_in, .. } => decide_in,
        other => panic!("a first sight is unproven: {other:?}"),
    };
    assert!(decide_in <= Duration::from_millis(1200), "one second's lease: {decide_in:?}");
    tokio::time::sleep(decide_in).await;
    let lease = won(&*store, &lock, "b", TTL).await;
    assert!(lease.token > 1_000_000, "a token from the server's clock: {}", lease.token);
}

fn check_one_line(err: &StoreError, kind: ErrorKind, needles: &[&str]) {
    assert_eq!(err.kind, kind, "{}", err.message);
    for needle in needles {
        assert!(err.message.contains(needle), "{needle:?} in {:?}", err.message);
    }
    assert!(!err.message.contains('\n'), "{:?}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_table_is_refused_naming_leaderrun_init() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start_empty).await.unwrap();
    for access in [Access::Create, Access::Existing] {
        let err = open_url(&server, "dynamodb://no-such-table", access).await.err().expect("refused");
        check_one_line(&err, ErrorKind::Refused, &["dynamodb://no-such-table", "does not exist", "leaderrun init"]);
        assert!(err.message.contains(REGION), "{}", err.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_creates_the_table_once() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start_empty).await.unwrap();
    let target = Target::parse("dynamodb://made-by-init").unwrap();
    let store = prepare_with(&target, configured(server.endpoint(), key_of(&server))).await.expect("init");
    won(&*store, "after-init", "a", TTL).await;
    // Again: the table is there, and kept (with its lock).
    let again = prepare_with(&target, configured(server.endpoint(), key_of(&server))).await.expect("init again");
    assert!(again.status("after-init").await.unwrap().is_held());
    let (status, body) = server.call("DescribeTable", r#"{"TableName":"made-by-init"}"#);
    assert_eq!(status, 200, "{body}");
    let table: serde_json::Value = serde_json::from_str(&body).unwrap();
    let table = &table["Table"];
    assert_eq!(table["BillingModeSummary"]["BillingMode"], "PAY_PER_REQUEST", "{table}");
    assert_eq!(table["KeySchema"], serde_json::json!([{"AttributeName": "key", "KeyType": "HASH"}]), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_with_another_key_is_refused() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start_empty).await.unwrap();
    let (status, body) = server.call(
        "CreateTable",
        r#"{"TableName":"other-key","AttributeDefinitions":[{"AttributeName":"id","AttributeType":"S"}],
            "KeySchema":[{"AttributeName":"id","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let err = open_url(&server, "dynamodb://other-key", Access::Create).await.err().expect("refused");
    check_one_line(&err, ErrorKind::Refused, &["dynamodb://other-key", "string partition key named \"key\""]);
}

/// A server that answers every request with `reply` (HTTP 200, DynamoDB's JSON).
fn fake_dynamodb(reply: &'static str) -> String {
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
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n",
                        reply.len()
                    );
                    if stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(reply.as_bytes())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    endpoint
}

/// moto shows no replicas, so a stand-in answers DescribeTable as DynamoDB does for a global
/// table (version 2019.11.21): the store is refused before any lock is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_global_table_is_refused() {
    let endpoint = fake_dynamodb(
        r#"{"Table":{"TableName":"global-locks","TableStatus":"ACTIVE",
            "AttributeDefinitions":[{"AttributeName":"key","AttributeType":"S"}],
            "KeySchema":[{"AttributeName":"key","KeyType":"HASH"}],"GlobalTableVersion":"2019.11.21",
            "Replicas":[{"RegionName":"us-east-1","ReplicaStatus":"ACTIVE"},{"RegionName":"eu-west-1","ReplicaStatus":"ACTIVE"}]}}"#,
    );
    let target = Target::parse("dynamodb://global-locks").unwrap();
    for access in [Access::Create, Access::Existing] {
        let err = open_with(&target, access, configured(endpoint.clone(), ("AKIAX".into(), "x".into())))
            .await
            .err()
            .expect("a global table must be refused");
        check_one_line(&err, ErrorKind::Refused, &["global table", "us-east-1, eu-west-1", "last-writer-wins"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_secret_is_refused_in_one_line_without_showing_it() {
    let server = tokio::task::spawn_blocking(MotoDynamo::start_with_iam).await.unwrap();
    let (id, secret) = key_of(&server);
    let target = Target::parse(&server.url()).unwrap();
    let right = open_with(&target, Access::Create, configured(server.endpoint(), (id.clone(), secret.clone())))
        .await
        .expect("the right secret");
    let lock = unique("iam");
    let lease = won(&*right, &lock, "a", TTL).await;
    let wrong = format!("{secret}-wrong");
    for access in [Access::Create, Access::Existing] {
        let err = open_with(&target, access, configured(server.endpoint(), (id.clone(), wrong.clone())))
            .await
            .err()
            .expect("a wrong secret is refused");
        check_one_line(&err, ErrorKind::Refused, &[&format!("dynamodb://{TABLE}"), "DescribeTable"]);
        assert!(!err.message.contains(&wrong), "{}", err.message);
    }
    // A session token never shows either.
    let token = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN";
    let endpoint = server.endpoint();
    let with_token = move |loader: ConfigLoader| {
        let credentials = aws_sdk_dynamodb::config::Credentials::new(id, wrong, Some(token.into()), None, "test");
        loader
            .endpoint_url(endpoint)
            .credentials_provider(credentials)
            .region(aws_sdk_dynamodb::config::Region::new(REGION))
    };
    let err = open_with(&target, Access::Create, with_token).await.err().expect("refused");
    assert!(!err.message.contains(token) && !err.message.contains('\n'), "{}", err.message);
    right.release(&lease, Duration::ZERO).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_an_outage() {
    let port = servers::free_port();
    let target = Target::parse("dynamodb://some-table").unwrap();
    let key = ("AKIAX".to_string(), "secret-x".to_string());
    let err = open_with(&target, Access::Create, configured(format!("http://127.0.0.1:{port}"), key))
        .await
        .err()
        .expect("nothing listens");
    assert!(err.is_transient(), "{}", err.message);
    assert!(err.message.contains("dynamodb://some-table") && !err.message.contains('\n'), "{:?}", err.message);
}

/// A one-shot run's first look at a held lock is not proof its holder lives; after one
/// observation without a change, the lock is taken (client-timed, on this host's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_holder_is_taken_over_after_one_observation() {
    let h = dynamo().await;
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

/// `leaderrun watch` on this store (it polls), and a standby still gets its turn. On a
/// current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&dynamo().await, &requests).await;
}
