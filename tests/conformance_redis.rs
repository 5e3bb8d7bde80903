//! The conformance suite against a real Redis server (one per test, started in a temporary
//! directory), and what only this store has: the key prefix, error kinds and messages
//! without the password, and riding out a server restart with the same client.

mod conformance;
mod servers;

use std::sync::Arc;

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, TTL};
use leaderrun::store::url::{open, Access, StoreSpec};
use leaderrun::store::{ErrorKind, Store, StoreError};
use servers::redis::Redis;

struct Rd {
    server: Redis,
}

async fn rd() -> Rd {
    Rd { server: Redis::start() }
}

async fn open_url(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open(&StoreSpec::Redis { url: url.to_string() }, Access::Create).await.map(Arc::from)
}

#[async_trait]
impl Harness for Rd {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.url()).await.expect("open the Redis store")
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
    let tls = format!("rediss://:{}@127.0.0.1:{port}/0", rd.server.password());
    check(open_url(&tls).await.err().unwrap(), ErrorKind::Refused, "TLS", rd.server.password());

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
