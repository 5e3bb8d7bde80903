//! The conformance suite against the embedded SQLite store (no server: a "restart"
//! drops every connection and reopens the file).

mod conformance;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conformance::Harness;
use leaderrun::store::url::{open, Access, StoreSpec};
use leaderrun::store::Store;

struct Sqlite {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

async fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    Sqlite { _dir: dir, path }
}

#[async_trait]
impl Harness for Sqlite {
    async fn open(&self) -> Arc<dyn Store> {
        let spec = StoreSpec::Sqlite { path: self.path.clone(), default: false };
        Arc::from(open(&spec, Access::Create).await.expect("open the SQLite store"))
    }

    async fn restart(&self) {}
}

conformance_suite!(sqlite());
