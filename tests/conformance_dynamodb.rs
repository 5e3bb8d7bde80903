//! The conformance suite and the client-timed stores' suite (tests/client_timed/: its
//! conditions, racing writes, tokens that outlive a deleted item, a deletion's overlap)
//! against moto's DynamoDB (one server per test); and what only this store has: the table's
//! checks (missing, another key, a global table), `leaderrun init`'s table, items of
//! awslabs' lock client, a retried write that finds its own, and refusals in one line
//! without the secret.
//!
//! `leases_survive_a_restart` runs too: moto keeps its tables in memory, but the test server
//! records every request and replays them into the restarted process (tests/servers/moto.rs).

mod client_timed;
mod conformance;
#[path = "../bench/proxy.rs"]
mod proxy;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use client_timed::{fake_http, RecordsHarness, Reply};
use conformance::{unique, won, Harness, TTL};
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

#[async_trait]
impl RecordsHarness for DynamoHarness {
    type Records = DynamoRecords;
    type Server = MotoDynamo;

    async fn records(&self) -> DynamoRecords {
        records(&self.server).await
    }

    async fn delete(&self, lock: &str) {
        self.server.delete_item(lock);
    }

    fn server(&self) -> &MotoDynamo {
        &self.server
    }

    async fn open_unreachable(port: u16) -> (String, Result<Box<dyn Store>, StoreError>) {
        let target = Target::parse("dynamodb://some-table").unwrap();
        let key = ("AKIAX".to_string(), "secret-x".to_string());
        let endpoint = format!("http://127.0.0.1:{port}");
        ("dynamodb://some-table".into(), open_with(&target, Access::Create, configured(endpoint, key)).await)
    }
}

conformance_suite!(dynamo());
client_timed_suite!(DynamoHarness, dynamo());

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

/// moto shows no replicas, so a stand-in answers DescribeTable as DynamoDB does for a global
/// table (version 2019.11.21): the store is refused before any lock is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_global_table_is_refused() {
    let endpoint = fake_http(|_| {
        let table = r#"{"Table":{"TableName":"global-locks","TableStatus":"ACTIVE",
            "AttributeDefinitions":[{"AttributeName":"key","AttributeType":"S"}],
            "KeySchema":[{"AttributeName":"key","KeyType":"HASH"}],"GlobalTableVersion":"2019.11.21",
            "Replicas":[{"RegionName":"us-east-1","ReplicaStatus":"ACTIVE"},{"RegionName":"eu-west-1","ReplicaStatus":"ACTIVE"}]}}"#;
        Reply::json("200 OK", "application/x-amz-json-1.0", table)
    });
    let endpoint = format!("http://{endpoint}");
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
