//! The conformance suite against a real MariaDB server, started by the test on loopback
//! in a temporary directory (one server per test); a restart stops it with SIGTERM and
//! starts it again on the same data directory and port.

mod conformance;
mod servers;

use std::sync::Arc;

use async_trait::async_trait;
use conformance::Harness;
use leaderrun::store::url::{open, Access, StoreSpec};
use leaderrun::store::Store;
use servers::mariadb::Mariadb;

struct MariadbHarness {
    server: Mariadb,
}

async fn mariadb() -> MariadbHarness {
    let server = tokio::task::spawn_blocking(Mariadb::start).await.expect("start MariaDB");
    MariadbHarness { server }
}

#[async_trait]
impl Harness for MariadbHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let spec = StoreSpec::from_url(&self.server.url()).expect("a valid URL");
        match open(&spec, Access::Create).await {
            Ok(store) => Arc::from(store),
            Err(err) => panic!("open the MariaDB store: {err}"),
        }
    }

    async fn restart(&self) {
        tokio::task::block_in_place(|| {
            self.server.stop();
            self.server.start_again();
        });
    }
}

conformance_suite!(mariadb());

/// A table made by an earlier leaderrun, without the `kept` column: the first statement that
/// needs it adds it, and `leaderrun release` then ends a --min-hold keep at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_from_before_the_kept_column_gets_it() {
    use std::time::Duration;
    let h = mariadb().await;
    h.server.root_sql(
        "CREATE TABLE leaderrun.old_locks (name VARBINARY(1020) NOT NULL PRIMARY KEY, \
         holder VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, token BIGINT UNSIGNED NOT NULL, \
         acquired_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL, revoked BOOLEAN NOT NULL DEFAULT 0) \
         ENGINE=InnoDB",
    );
    let spec = StoreSpec::from_url(&format!("{}?table=old_locks", h.server.url())).expect("a valid URL");
    let a: Arc<dyn Store> = Arc::from(open(&spec, Access::Create).await.expect("open"));
    let admin: Arc<dyn Store> = Arc::from(open(&spec, Access::Existing).await.expect("open"));
    let lease = conformance::won(&*a, "x", "a", conformance::TTL).await;
    a.release(&lease, Duration::from_secs(3600)).await.unwrap();
    assert!(admin.revoke("x").await.unwrap().is_some());
    assert!(!admin.status("x").await.unwrap().is_held(), "the keep ended at once");
}
