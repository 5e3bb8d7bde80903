//! What each store says of itself, so that one list (`registry.rs`) can name every store
//! and nothing else has to: its schemes and help, and its URL parsed into a `StoreSpec`
//! that knows, before anything connects, what the run's timings and checks need.
//!
//! A store fills in one `StoreKind` in its own folder (`kind.rs`) and implements
//! `StoreSpec` for its parsed URL. Nothing here names a store.

use std::ops::RangeInclusive;
use std::time::Duration;

use async_trait::async_trait;

use super::{Access, Result, Store};

/// A store, as the registry lists it.
pub struct StoreKind {
    /// Its name: the Cargo feature that builds it and its page, `docs/stores/NAME.md`.
    pub name: &'static str,
    /// The URL schemes that name it (`postgres`, `postgresql`), lowercase.
    pub schemes: &'static [&'static str],
    /// The URL's shape, one line, for `--store`'s help: `postgres://user:pass@host:5432/db`.
    pub usage: &'static str,
    /// The URL with every part it takes, for the STORES section of `--help` and the man page.
    pub url: &'static str,
    /// What it guarantees and what it does not, for the STORES section.
    pub help: &'static str,
    /// Parse a URL of one of `schemes` (the whole URL, scheme included). A bad URL is a bare
    /// reason (the caller names the flag and the URL, without its password): a usage error
    /// before anything connects.
    pub parse: fn(&str) -> std::result::Result<Box<dyn StoreSpec>, String>,
}

/// A store URL, parsed: what the run needs to know of the store before it connects, and
/// how to connect.
#[async_trait]
pub trait StoreSpec: Send + Sync {
    /// The store, for messages: a path, or the URL without its password.
    fn shown(&self) -> String;

    /// Connect (and, with `Access::Create`, make what the store needs on first use).
    async fn open(&self, access: Access) -> Result<Box<dyn Store>>;

    /// `leaderrun init`: make now what a run would make on first use (most stores make what
    /// they need as they open).
    async fn prepare(&self) -> Result<Box<dyn Store>> {
        self.open(Access::Create).await
    }

    /// What `prepare` makes, as the statement or command an operator would run instead
    /// (`leaderrun init --print-sql`): a table's `CREATE TABLE`. `None` for a store that
    /// makes nothing ahead of its first use.
    fn setup_text(&self) -> Option<String> {
        None
    }

    /// Whether the store judges expiry on its servers' wall clocks, so that a failover to a
    /// server whose clock differs moves every lease's expiry by the difference
    /// (--server-clock-skew counts).
    fn expiry_on_server_wall_clock(&self) -> bool;

    /// The store's failover as the URL alone tells it (`Store::failover`), known before
    /// anything connects, so that opening the store rides it out too.
    fn known_failover(&self) -> Duration {
        Duration::ZERO
    }

    /// The lease lifetimes this store can keep (what a run asks it for: `Timing::store_ttl`,
    /// --ttl + --lock-delay), if it takes only some: a run whose lease falls outside is refused
    /// before anything connects. A lease inside the range that the store cannot ask for exactly
    /// (not whole seconds) is the store's to round up: a longer lease in the store is safe, the
    /// holder's deadline does not move.
    fn lease_limits(&self) -> Option<RangeInclusive<Duration>> {
        None
    }

    /// Whether this store can keep a lock of this name (beyond `validate_lock_name`'s rules):
    /// a bare reason if not, for a usage error before anything connects.
    fn check_lock_name(&self, _lock: &str) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Debug output shows the store as messages do: never a password.
impl std::fmt::Debug for dyn StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreSpec({})", self.shown())
    }
}
