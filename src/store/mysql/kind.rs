//! The MySQL or MariaDB store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{schema_sql, MySqlStore, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "mysql",
    schemes: &["mysql", "mariadb"],
    usage: "mysql://user:pass@host:3306/db (or mariadb://)",
    url: "mysql://user:pass@host:3306/db?ssl-mode=VERIFY_IDENTITY&table=NAME",
    help: "Also mariadb://. A conditional UPDATE whose affected-row count decides, on the server's UTC_TIMESTAMP(6); \
           the holder keeps a user-level lock (GET_LOCK) that waiters block on, one connection each, and a second \
           one for the waiter that ends the session of a waiter frozen at its turn (a hint only: a lease is still \
           taken over at its expiry). The server's clock must be slewed, never stepped. After a failover (another \
           @@server_id) nothing is granted until the longest lease asked for has passed, and tokens jump above the \
           old ones; writes must go to one server (not multi-primary) and the binlog format be ROW or MIXED. \
           URL parameters other than table=, ssl-mode, ssl-ca, ssl-cert, ssl-key and socket are refused.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(MySqlStore::open(self, access).await?))
    }

    fn setup_text(&self) -> Option<String> {
        Some(schema_sql(self.table()))
    }

    /// Expiry is judged on the server's UTC_TIMESTAMP(6).
    fn expiry_on_server_wall_clock(&self) -> bool {
        true
    }
}
