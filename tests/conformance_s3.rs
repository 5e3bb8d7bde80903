//! The conformance suite and the client-timed stores' suite (tests/client_timed/: its
//! preconditions, racing writes, tokens that outlive a deleted object, a deletion's overlap)
//! against moto's S3 (one server per test); and what only this store has: object keys,
//! refusals in one line without the secret, and the check that refuses a server which
//! ignores preconditions.
//!
//! `leases_survive_a_restart` runs too: moto keeps its objects in memory, but the test
//! server records every request and replays them into the restarted process (see
//! tests/servers/moto.rs), which rebuilds each object with the same body and so the same ETag.

mod client_timed;
mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use client_timed::{fake_http, RecordsHarness, Reply};
use conformance::{unique, won, Harness, TTL};
use leaderrun::store::s3::{open_with, ConfigLoader, S3Records, Target};
use leaderrun::store::Access;
use leaderrun::store::{ErrorKind, Store, StoreError};
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

#[async_trait]
impl RecordsHarness for S3Harness {
    type Records = S3Records;
    type Server = Moto;

    async fn records(&self) -> S3Records {
        records(&self.server).await
    }

    async fn delete(&self, lock: &str) {
        sdk(&self.server).await.delete_object().bucket(BUCKET).key(format!("leaderrun/{lock}")).send().await.unwrap();
    }

    fn server(&self) -> &Moto {
        &self.server
    }

    async fn open_unreachable(port: u16) -> (String, Result<Box<dyn Store>, StoreError>) {
        let target = Target::parse("s3://some-bucket").unwrap();
        let key = ("AKIAX".to_string(), "secret-x".to_string());
        (
            "s3://some-bucket".into(),
            open_with(&target, Access::Create, configured(format!("http://127.0.0.1:{port}"), key)).await,
        )
    }
}

conformance_suite!(s3());
client_timed_suite!(S3Harness, s3());

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

/// A server that answers every PutObject with 200, preconditions or not: two hosts could
/// both "create" a lock. It is refused when a run opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_preconditions_is_refused_at_open() {
    let endpoint = fake_http(|_| Reply {
        status: "200 OK".into(),
        headers: "ETag: \"0123456789abcdef0123456789abcdef\"\r\n".into(),
        body: String::new(),
    });
    let endpoint = format!("http://{endpoint}");
    let target = Target::parse("s3://careless-bucket").unwrap();
    let err = open_with(&target, Access::Create, configured(endpoint, ("AKIAX".into(), "x".into())))
        .await
        .err()
        .expect("a server that ignores If-Match must be refused");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("ignores If-Match") && !err.message.contains('\n'), "{:?}", err.message);
}
