//! The PostgreSQL store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{schema_sql, PostgresStore, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    usage: "postgres://user:pass@host:5432/db",
    url: "postgres://user:pass@host:5432/db?sslmode=verify-full&table=NAME",
    help: "Also postgresql://; PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE and ~/.pgpass are honoured. \
           Each step is one statement (INSERT ... ON CONFLICT ... WHERE free or expired); expiry is judged on the \
           server's clock_timestamp(), so the server's clock must be slewed, never stepped. A release wakes the waiter \
           that has waited longest through LISTEN/NOTIFY; if it does not act (frozen, or its host \
           gone), the others try after a stagger of at most 300 ms. A transaction-pooling proxy does not pass LISTEN/NOTIFY: waiters then re-read when the lease \
           they saw would expire. No advisory locks. After a failover to a standby (a new timeline) nothing is granted until the longest \
           lease asked for has passed, and tokens jump above the old ones: an asynchronous standby that lost the \
           latest acquisition shares no lease; its holder loses it. URL parameters other than \
           table= and libpq's sslmode, sslrootcert, sslcert, sslkey, options, application_name (and the like) are \
           refused.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(PostgresStore::open(self, access).await?))
    }

    async fn prepare(&self) -> Result<Box<dyn Store>> {
        Ok(Box::new(PostgresStore::prepare(self).await?))
    }

    fn setup_text(&self) -> Option<String> {
        Some(schema_sql(self.table()))
    }

    /// Expiry is judged on the server's clock_timestamp().
    fn expiry_on_server_wall_clock(&self) -> bool {
        true
    }
}
