//! The store's one connection, lent to a call and kept only if the call ended well.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;

/// The store's connection for one call. Unless the call says it ended well (`done`), the
/// connection is dropped when this is: a call that failed may have lost it, and one that was
/// cancelled (the elector's timeout) may have left a statement half sent or unread.
pub(super) struct Conn<'a> {
    pub(super) slot: tokio::sync::MutexGuard<'a, Option<PoolConnection<Postgres>>>,
    pub(super) kept: bool,
}

impl Conn<'_> {
    pub(super) fn done(mut self, ok: bool) {
        self.kept = ok;
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &Self::Target {
        self.slot.as_ref().expect("a connection is in the slot while a call holds it")
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.slot.as_mut().expect("a connection is in the slot while a call holds it")
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.slot.take();
        }
    }
}
