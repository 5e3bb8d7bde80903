//! What `leaderrun watch` listens to: a channel of its own, beside the waiters' turns.
//!
//! An acquire that wins and a release that keeps the lease for --min-hold send `NOTIFY
//! leaderrun_change, '<lock name>'` in their own statement; a release that frees the lock and
//! a revoke already send `NOTIFY leaderrun, '<lock name>'`. A watcher LISTENs on both, on a
//! connection of its own whose session is not marked as waiting (`turns.rs`): no release ever
//! names it, so it takes no turn and no waiter wakes because of it. A renewal sends nothing
//! (it would cost every holder a notification per renewal for the sake of a watcher that
//! may not exist), and neither does an expiry: `watch` reads again when the lease it saw
//! would lapse.
//!
//! What it costs: the acquire's NOTIFY is queued at commit, whether or not anyone listens:
//! with pgbench against a local server, 0.26-0.34 ms an acquire with it against 0.23-0.31 ms
//! without (a busy 2-core host: within the noise). Behind a transaction-pooling proxy that
//! refuses LISTEN, a watcher reads once a second instead (`release_feed::observe`).

use async_trait::async_trait;
use sqlx::postgres::PgListener;

use super::{PostgresStore, CHANNEL};
use crate::store::release_feed::{Heard, ReleaseFeed};
use crate::store::Result;

/// The channel a take and a keep are announced on; the payload is the lock name.
pub const CHANGE_CHANNEL: &str = "leaderrun_change";

/// A watcher's listener.
pub struct Changes {
    listener: PgListener,
}

#[async_trait]
impl ReleaseFeed for Changes {
    async fn next(&mut self) -> Heard {
        match self.listener.try_recv().await {
            // Both channels carry the lock's name.
            Ok(Some(notification)) => Heard::Released(notification.payload().to_string()),
            // The connection was lost: a change may have gone unheard.
            Ok(None) | Err(_) => Heard::Lost,
        }
    }
}

impl PostgresStore {
    /// Listen for every change announced, on a session of its own.
    pub(super) async fn listen_for_changes(&self) -> Result<Changes> {
        // One line per request at -vvv: the benchmarks count them (connect, listen).
        tracing::trace!(op = "watch", "store request");
        let mut listener = PgListener::connect_with(&self.watch_pool).await.map_err(|e| self.error(e))?;
        // A lost connection is reported to us (we re-read: a change may have been missed).
        listener.eager_reconnect(false);
        listener.listen_all([CHANNEL, CHANGE_CHANNEL]).await.map_err(|e| self.error(e))?;
        Ok(Changes { listener })
    }
}
