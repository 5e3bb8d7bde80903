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
