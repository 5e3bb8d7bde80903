//! What `leaderrun watch` listens to: the channel releases are published on.
//!
//! A release that frees a lock, and a revoke that frees a kept one, publish the lock's name on
//! `{prefix}released` (for waiters that subscribe rather than block). An acquire that wins, a
//! release that keeps the lease for --min-hold and a revoke that only marks it publish
//! `<name>\n<what>` there too: never a lock name (a name has no newline), so such a waiter
//! ignores it, and an ACL that lets a user publish releases needs nothing more. A watcher
//! subscribes on a connection of its own and never touches the wake lists, so it takes no
//! waiter's turn (a BLPOP would). A renewal publishes nothing (every holder would pay for it
//! at every renewal), and Redis expires a key silently (keyspace notifications are off unless
//! the server is configured for them): `watch` reads again when the lease it saw would lapse.

use async_trait::async_trait;

use super::Subscription;
use crate::store::release_feed::{Heard, ReleaseFeed};

/// A watcher's subscription.
pub(super) struct Changes(pub(super) Subscription);

#[async_trait]
impl ReleaseFeed for Changes {
    async fn next(&mut self) -> Heard {
        match self.0.next().await {
            Heard::Released(payload) => Heard::Released(lock_of(&payload).to_string()),
            other => other,
        }
    }
}

/// The lock a message names: all of a release's, up to the newline of another change's.
fn lock_of(payload: &str) -> &str {
    payload.split_once('\n').map_or(payload, |(lock, _what)| lock)
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_name_their_lock() {
        assert_eq!(super::lock_of("a:b c"), "a:b c");
        assert_eq!(super::lock_of("a:b c\ntaken"), "a:b c");
        assert_eq!(super::lock_of("a\nkept"), "a");
    }
}
