//! Whose turn it is when a lock is freed: one waiter's view of the lock's key.
//!
//! Only a hint. Taking the lock is still the acquire's compare-and-set alone; this decides
//! when a waiter sends it, so that a release costs one acquire instead of one per waiter. A
//! waiter that reads the signs wrongly (a message late, one missed) at worst acts too early
//! (a lost race: a refused publish and a read) or too late (one stagger, or the safety net).
//!
//! A waiter sees two things. Its KV watch shows every message on the key, in order, with its
//! stream sequence: a delete, purge or expiry marker frees the lock, a PUT is a holder's
//! write. Its queue subscription on the key's subject, shared with the other waiters, gets
//! the messages publishers send there, each to ONE member of the group: a release's delete,
//! whose `Nats-Expected-Last-Subject-Sequence` names the message it deletes, reaches one
//! waiter, which is the one chosen to go first. The server's own expiry markers are stored
//! without being published, so nobody is chosen for an expiry.
//!
//! The two arrive on different subscriptions, in either order. A waiter whose watch shows the
//! marker and whose queue brought the delete of the message before it (whichever came first)
//! acts at once; every other waiter waits a stagger and acts only if by then no new holder's
//! PUT came after the marker. A chosen waiter that is frozen or dead thus costs the others one
//! stagger, and an expiry is taken by the first stagger to run out, while the rest see its PUT.

use std::time::Duration;

use tokio::time::Instant;

/// How long a waiter that was not chosen gives the chosen one before it acts itself, at
/// least: the handoff on a loaded host (the chosen waiter's wake-up, its publish, the new
/// holder's PUT back to the others) is far shorter, so a live chosen waiter is almost never
/// raced; short beside any lease, since it is what a frozen or dead chosen waiter, or an
/// expiry, costs the others.
pub const STAGGER_FROM: Duration = Duration::from_millis(100);
/// The longest stagger. Each waiter draws its own between the two, so that after an expiry
/// (nobody chosen) the first to act is usually alone for a while, and the others see its PUT.
pub const STAGGER_TO: Duration = Duration::from_millis(300);

/// A random stagger for one freeing of the lock.
pub fn stagger() -> Duration {
    use rand::Rng;
    rand::rng().random_range(STAGGER_FROM..STAGGER_TO)
}

/// What the waiter should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Keep watching: the lock is held, or until `until` it is the chosen waiter's turn.
    Wait { until: Option<Instant> },
    /// Try to take the lock, expecting `marker` (the marker that freed it; 0: the key has no
    /// message at all) to be the key's last message still.
    Go { marker: u64 },
}

/// One waiter's view of the lock's key: a read, then the watch's messages and the queue's.
#[derive(Debug)]
pub struct Turns {
    /// The newest stream sequence seen on the key (in the read or on the watch): anything
    /// at or below it is old news.
    newest: u64,
    /// Set while the newest message seen frees the lock.
    freed: Option<Freed>,
    /// The queue brought the delete of this message (or of whatever was last, for a delete
    /// that did not say: another tool's) before the watch showed the marker.
    chosen: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Freed {
    /// The marker's sequence.
    marker: u64,
    /// The newest message seen before the marker: the one it deleted (or one before it, when
    /// the watch skipped a message a newer one had already replaced).
    after: u64,
    /// When this waiter acts.
    go_at: Instant,
}

impl Turns {
    /// The view as of a read that found the key's last message at `seq`, `gone` if a marker
    /// (`seq` 0: the key has none). A lock free at that read is everyone's at once: this is a
    /// waiter's first look, not a release it saw.
    pub fn read(seq: u64, gone: bool, now: Instant) -> Self {
        let freed = (gone || seq == 0).then_some(Freed { marker: seq, after: seq, go_at: now });
        Self { newest: seq, freed, chosen: None }
    }

    /// The watch showed the message `seq`: a marker if `gone`, else a PUT. A marker opens a
    /// turn, at once if the queue already chose this waiter for it, else after `stagger`; a
    /// PUT (a new holder: nothing is written after a marker but by an acquire) closes it.
    pub fn watched(&mut self, seq: u64, gone: bool, now: Instant, stagger: Duration) {
        if seq <= self.newest {
            return;
        }
        let chosen = self.chosen.take();
        // A choice for a delete of this message or a later one is still to come (the watch
        // may lag behind the queue); one for an earlier message is used here or never.
        self.chosen = chosen.filter(|&deleted| deleted >= seq);
        if gone {
            let mut go_at = if chosen.is_some_and(|deleted| deleted < seq) { now } else { now + stagger };
            // Freed twice in a row (a delete, then a purge by hand): still free since the first.
            if let Some(open) = self.freed {
                go_at = go_at.min(open.go_at);
            }
            self.freed = Some(Freed { marker: seq, after: self.newest, go_at });
        } else {
            self.freed = None;
        }
        self.newest = seq;
    }

    /// The queue brought this waiter a delete of the message `deleted` (`None`: a delete that
    /// does not say which, as another tool sends): it is the one chosen to go first.
    pub fn chosen(&mut self, deleted: Option<u64>, now: Instant) {
        match (&mut self.freed, deleted) {
            (Some(open), None) => open.go_at = open.go_at.min(now),
            (Some(open), Some(deleted)) if (open.after..open.marker).contains(&deleted) => {
                open.go_at = open.go_at.min(now)
            }
            // The watch has not shown the marker yet.
            (_, Some(deleted)) if deleted >= self.newest => self.chosen = Some(deleted),
            (None, None) => self.chosen = Some(self.newest),
            // The delete of an older message: it was refused, or its turn is over.
            (_, Some(_)) => {}
        }
    }

    /// An acquire read the key and found it held at `seq`: whatever turn is open is over,
    /// even if the new holder's PUT has not reached the watch yet (acting again would only
    /// lose again).
    pub fn held_at(&mut self, seq: u64) {
        if seq > self.newest {
            self.freed = None;
            self.chosen = self.chosen.filter(|&deleted| deleted >= seq);
            self.newest = seq;
        }
    }

    pub fn turn(&self, now: Instant) -> Turn {
        match self.freed {
            Some(open) if open.go_at <= now => Turn::Go { marker: open.marker },
            Some(open) => Turn::Wait { until: Some(open.go_at) },
            None => Turn::Wait { until: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGGER: Duration = Duration::from_millis(200);
    const WAIT: Turn = Turn::Wait { until: None };

    /// A waiter that read the lock held by the message 5.
    fn held(now: Instant) -> Turns {
        Turns::read(5, false, now)
    }

    #[tokio::test(start_paused = true)]
    async fn the_chosen_waiter_goes_at_once_whichever_sign_comes_first() {
        let now = Instant::now();
        // The queue's delete first, then the watch's marker.
        let mut turns = held(now);
        turns.chosen(Some(5), now);
        assert_eq!(turns.turn(now), WAIT, "the queue alone is no turn: the marker's sequence is needed");
        turns.watched(6, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Go { marker: 6 });

        // The marker first: a stagger, cut short by the queue's delete.
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Wait { until: Some(now + STAGGER) });
        tokio::time::advance(Duration::from_millis(3)).await;
        turns.chosen(Some(5), Instant::now());
        assert_eq!(turns.turn(Instant::now()), Turn::Go { marker: 6 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_not_chosen_acts_after_its_stagger_unless_a_new_holder_wrote() {
        let now = Instant::now();
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        tokio::time::advance(STAGGER - Duration::from_millis(1)).await;
        assert_eq!(turns.turn(Instant::now()), Turn::Wait { until: Some(now + STAGGER) });
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(turns.turn(Instant::now()), Turn::Go { marker: 6 }, "the chosen waiter is frozen or dead");

        // The chosen waiter took it: its PUT ends the turn, and the stagger with it.
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        turns.watched(7, false, now, STAGGER);
        tokio::time::advance(STAGGER * 2).await;
        assert_eq!(turns.turn(Instant::now()), WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_chooses_nobody() {
        let now = Instant::now();
        let mut turns = held(now);
        // An expiry marker: no delete was published, so no queue message comes.
        turns.watched(6, true, now, STAGGER);
        assert_eq!(turns.turn(now + STAGGER), Turn::Go { marker: 6 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_choice_for_another_release_does_not_count() {
        let now = Instant::now();
        let mut turns = held(now);
        // A release of 5 that the server refused (a revoke wrote 6 first): its delete still
        // reached this waiter. The lock is freed later, by a delete of 6.
        turns.chosen(Some(5), now);
        turns.watched(6, false, now, STAGGER);
        turns.watched(7, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Wait { until: Some(now + STAGGER) });
        // That older delete arriving late changes nothing either.
        turns.chosen(Some(5), now);
        assert_eq!(turns.turn(now), Turn::Wait { until: Some(now + STAGGER) });
        // The delete of 6 is this waiter's.
        turns.chosen(Some(6), now);
        assert_eq!(turns.turn(now), Turn::Go { marker: 7 });
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_may_lag_behind_the_queue() {
        let now = Instant::now();
        let mut turns = held(now);
        // The holder renewed (6) and released it (7, deleting 6); the queue brings the delete
        // before the watch has even shown the renewal.
        turns.chosen(Some(6), now);
        turns.watched(6, false, now, STAGGER);
        assert_eq!(turns.turn(now), WAIT);
        turns.watched(7, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Go { marker: 7 });
        // A watch that skipped the renewal (replaced before it was delivered) still matches.
        let mut turns = held(now);
        turns.chosen(Some(6), now);
        turns.watched(7, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Go { marker: 7 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_delete_that_names_no_message_chooses_for_the_current_one() {
        let now = Instant::now();
        let mut turns = held(now);
        turns.chosen(None, now);
        turns.watched(6, true, now, STAGGER);
        assert_eq!(turns.turn(now), Turn::Go { marker: 6 });
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        turns.chosen(None, now);
        assert_eq!(turns.turn(now), Turn::Go { marker: 6 });
    }

    #[tokio::test(start_paused = true)]
    async fn old_news_and_a_lost_race_close_the_turn() {
        let now = Instant::now();
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        // The watch repeating what the read showed, or older, changes nothing.
        turns.watched(5, false, now, STAGGER);
        turns.watched(6, false, now, STAGGER);
        assert_eq!(turns.turn(now + STAGGER), Turn::Go { marker: 6 });
        // This waiter's acquire lost: its read found the lock held at 8, before the watch did.
        turns.held_at(8);
        assert_eq!(turns.turn(now + STAGGER), WAIT);
        turns.watched(8, false, now, STAGGER);
        assert_eq!(turns.turn(now + STAGGER), WAIT);
        // A read older than the watch's news changes nothing.
        turns.watched(9, true, now, STAGGER);
        turns.held_at(8);
        assert_eq!(turns.turn(now + STAGGER), Turn::Go { marker: 9 });
    }

    #[tokio::test(start_paused = true)]
    async fn freed_twice_keeps_the_earlier_time() {
        let now = Instant::now();
        let mut turns = held(now);
        turns.watched(6, true, now, STAGGER);
        tokio::time::advance(Duration::from_millis(50)).await;
        turns.watched(7, true, Instant::now(), STAGGER);
        assert_eq!(turns.turn(now + STAGGER), Turn::Go { marker: 7 }, "the latest marker is the one expected");
    }

    #[test]
    fn a_lock_free_at_the_first_read_is_everyones_at_once() {
        let now = Instant::now();
        assert_eq!(Turns::read(0, false, now).turn(now), Turn::Go { marker: 0 });
        assert_eq!(Turns::read(4, true, now).turn(now), Turn::Go { marker: 4 });
        assert_eq!(Turns::read(4, false, now).turn(now), WAIT);
    }

    #[test]
    fn staggers_stay_in_range() {
        for _ in 0..100 {
            assert!((STAGGER_FROM..STAGGER_TO).contains(&stagger()));
        }
    }
}
