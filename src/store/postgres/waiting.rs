//! A waiter's LISTEN connection as a release feed (`release_feed.rs`), with its turns.

use async_trait::async_trait;
use sqlx::postgres::PgListener;

use super::turns::{self, Note, Turns};
use crate::store::release_feed::{Heard, ReleaseFeed};

/// A waiter's listener, and what it heard so far (`turns.rs`).
pub(super) struct Waiting {
    pub(super) listener: PgListener,
    pub(super) turns: Turns,
}

/// A lock is announced released to the waiter whose turn it is at once, to the others after
/// their stagger unless it was taken meanwhile (to every waiter at once when nobody was
/// picked, after `TURN_GRACE` for a plain release with no turn).
#[async_trait]
impl ReleaseFeed for Waiting {
    async fn next(&mut self) -> Heard {
        let received = match self.turns.due() {
            Some(due) => match tokio::time::timeout_at(due, self.listener.try_recv()).await {
                Ok(received) => received,
                Err(_) => {
                    self.turns.lapse();
                    return Heard::Released(self.turns.lock().to_string());
                }
            },
            None => self.listener.try_recv().await,
        };
        match received {
            Ok(Some(notification)) => {
                tracing::trace!(channel = notification.channel(), payload = notification.payload(), "heard");
                let note = Note::parse(notification.channel(), notification.payload());
                let now = tokio::time::Instant::now();
                if note.is_some_and(|note| self.turns.heard(note, now, turns::stagger())) {
                    Heard::Released(self.turns.lock().to_string())
                } else {
                    Heard::Nothing
                }
            }
            // The connection was lost: a release may have gone unheard.
            Ok(None) | Err(_) => Heard::Lost,
        }
    }
}
