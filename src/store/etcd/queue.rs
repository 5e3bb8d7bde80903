//! The standbys' queue on one lock: who goes first when the lock is freed.
//!
//! Only a hint. Taking the lock is still the acquire transaction alone; the queue decides
//! which waiter sends it first, so that a release costs one acquire instead of one per waiter.
//! A waiter that reads the queue wrongly (an event late, an entry missed) at worst acts too
//! early (a lost race: a few wasted requests) or too late (a stagger, or the safety net).
//!
//! Each waiting store puts one empty key `{prefix}queue/{lock}/{lease id}` on an etcd lease of
//! its own (`QUEUE_TTL`); its place is the key's create revision. It watches the lock key and
//! the queue's prefix, and keeps here what those showed: the live entries, and whether the lock
//! key is gone. When the lock key is deleted, the waiter with no live entry before its own acts
//! at once; the one with `n` before it waits `n × STAGGER` and acts only if by then no new
//! holder has written the lock key (the watch shows its PUT). So a dead waiter's entry delays
//! the ones behind it by a stagger, not by its lease: etcd's `concurrency.Mutex`, where each
//! waiter watches only its predecessor's key, stalls behind a dead waiter until its lease
//! lapses, and costs a read at every turn. Here every waiter sees every release (the events
//! are pushed: they cost no request), and only the waiters' time order changes.
//!
//! The rank is fixed when the lock key's DELETE is seen. Entries that vanish afterwards do not
//! move anyone up: the winner deletes its entry in the same transaction that writes the lock
//! key, and the two watchers' events may arrive in either order, so the next waiter would
//! otherwise see itself first before it sees the new holder, and race it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::wire::{Event, KeyValue, EVENT_DELETE, EVENT_PUT};

/// The lease of a queue entry: twice the elector's 60 s safety net, the longest it goes
/// without calling `changed` again, when the entry is kept alive (`REFRESH_AFTER`). A waiter
/// that dies leaves its entry at most this long, unless a waiter behind it that took the
/// lock in its place deletes it first.
pub const QUEUE_TTL: Duration = Duration::from_secs(120);

/// A waiter whose entry was last confirmed alive this long ago keeps it alive when it waits
/// again (one LeaseKeepAlive). Shorter than the safety net, so that an idle standby refreshes
/// at each of its safety-net re-reads; far longer than the waits between two turns, so that a
/// standby woken by releases sends nothing for it.
pub const REFRESH_AFTER: Duration = Duration::from_secs(30);

/// How long each waiter ahead gets to take a freed lock before the next one tries. Longer than
/// a handoff on a loaded host (the first waiter's wake-up, a lease grant and the transaction,
/// each a Raft write, and the new holder's PUT back to the others), so that a live first
/// waiter is almost never raced; short beside any lease, since it is what a dead waiter ahead
/// costs the ones behind it, once.
pub const STAGGER: Duration = Duration::from_millis(50);

/// The key of the entry a waiter puts in `queue` (the lock's queue prefix) on `lease_id`.
/// A lease id is unique in the cluster and its hex has no `/`, which is how entries of this
/// lock are told from those of a lock whose name extends this one's (`a` and `a/b`).
pub fn entry_key(queue: &[u8], lease_id: i64) -> Vec<u8> {
    let mut key = queue.to_vec();
    key.extend_from_slice(format!("{lease_id:016x}").as_bytes());
    key
}

/// What the waiter should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Keep watching: the lock is held, or it is another waiter's turn until `until`.
    Wait { until: Option<Instant> },
    /// Try to take the lock. `passed` are the entries that were ahead and let their turn go by
    /// (empty: this waiter was first); a waiter that wins deletes them with its own.
    Go { passed: Vec<Vec<u8>> },
}

/// One waiter's view of the lock key and its queue: a snapshot read at one revision, then the
/// watch's events from the next.
#[derive(Debug)]
pub struct Line {
    lock_key: Vec<u8>,
    queue: Vec<u8>,
    /// Every live entry of this lock's queue: key → create revision (the place in the queue).
    entries: BTreeMap<Vec<u8>, i64>,
    /// This waiter's entry, if it has one (it may have been deleted since: see `in_queue`).
    mine: Option<Vec<u8>>,
    /// Set while the lock key is gone: when this waiter saw it go, and who was ahead then.
    freed: Option<Freed>,
    /// The revision the lock key's state above is known at: older events are stale.
    lock_seen: i64,
}

#[derive(Debug)]
struct Freed {
    at: Instant,
    ahead: Vec<Vec<u8>>,
}

impl Line {
    /// The view as of one read at `revision` that found the lock key (held), with `mine` this
    /// waiter's entry if it has one; the read's queue entries go in with `load`. A read that
    /// found the lock key gone calls `lock_freed` after them.
    pub fn new(lock_key: Vec<u8>, queue: Vec<u8>, mine: Option<Vec<u8>>, revision: i64) -> Self {
        Self { lock_key, queue, entries: BTreeMap::new(), mine, freed: None, lock_seen: revision }
    }

    /// The queue's entries as read.
    pub fn load(&mut self, entries: &[KeyValue]) {
        for kv in entries {
            self.put_entry(kv);
        }
    }

    /// This waiter's entry was (re)written at create revision `create_revision`.
    pub fn joined(&mut self, key: Vec<u8>, create_revision: i64) {
        self.entries.insert(key.clone(), create_revision);
        self.mine = Some(key);
    }

    /// A read at `revision` found the lock held (this waiter's acquire lost): whatever turn
    /// the watch showed is over, even if the new holder's PUT is still on its way (acting on
    /// that turn again would only lose again).
    pub fn held_at(&mut self, revision: i64) {
        if revision > self.lock_seen {
            self.lock_seen = revision;
            self.freed = None;
        }
    }

    /// This waiter's entry is gone (its lease lapsed; the watch may not have shown it yet).
    pub fn leave(&mut self) {
        if let Some(mine) = self.mine.take() {
            self.entries.remove(&mine);
        }
    }

    /// Whether this waiter has a live entry (a winner may have deleted it as passed, or its
    /// lease lapsed): if not, it acts after every entry it knows of, and joins again.
    pub fn in_queue(&self) -> bool {
        self.mine.as_ref().is_some_and(|mine| self.entries.contains_key(mine))
    }

    /// One event of the watch (on the lock key or the queue prefix; others are ignored).
    pub fn see(&mut self, event: &Event, now: Instant) {
        let Some(kv) = &event.kv else { return };
        if kv.key == self.lock_key {
            if kv.mod_revision <= self.lock_seen {
                return;
            }
            self.lock_seen = kv.mod_revision;
            match event.r#type {
                EVENT_DELETE => self.lock_freed(now),
                // A new holder (or a rewrite of the holder's record): the turn is over.
                _ => self.freed = None,
            }
        } else if self.is_entry(&kv.key) {
            match event.r#type {
                EVENT_PUT => self.put_entry(kv),
                _ => {
                    self.entries.remove(&kv.key);
                }
            }
        }
    }

    /// What to do now.
    pub fn turn(&self, now: Instant) -> Turn {
        let Some(freed) = &self.freed else {
            return Turn::Wait { until: None };
        };
        let until = freed.at + STAGGER * freed.ahead.len() as u32;
        if now >= until {
            Turn::Go { passed: freed.ahead.clone() }
        } else {
            Turn::Wait { until: Some(until) }
        }
    }

    fn is_entry(&self, key: &[u8]) -> bool {
        key.strip_prefix(self.queue.as_slice()).is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
    }

    fn put_entry(&mut self, kv: &KeyValue) {
        if self.is_entry(&kv.key) {
            self.entries.insert(kv.key.clone(), kv.create_revision);
        }
    }

    /// The lock key is gone: the rank is fixed now (see the module doc). A second DELETE
    /// without a PUT between (none is expected) keeps the first.
    pub fn lock_freed(&mut self, now: Instant) {
        if self.freed.is_none() {
            self.freed = Some(Freed { at: now, ahead: self.ahead() });
        }
    }

    /// The live entries before this waiter's own; all of them if it has none.
    fn ahead(&self) -> Vec<Vec<u8>> {
        let mine = self.mine.as_ref().and_then(|mine| self.entries.get(mine)).copied();
        let mut ahead: Vec<_> = self.entries.iter().filter(|(_, &rev)| mine.is_none_or(|m| rev < m)).collect();
        ahead.sort_by_key(|(_, &rev)| rev);
        ahead.into_iter().map(|(key, _)| key.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &[u8] = b"/p/lock/a";
    const QUEUE: &[u8] = b"/p/queue/a/";

    fn kv(key: &[u8], create_revision: i64) -> KeyValue {
        KeyValue { key: key.to_vec(), create_revision, mod_revision: create_revision, value: Vec::new() }
    }

    /// An event at `revision` (a deleted key's create revision reads 0).
    fn event(r#type: i32, key: &[u8], revision: i64) -> Event {
        let create_revision = if r#type == EVENT_DELETE { 0 } else { revision };
        Event { r#type, kv: Some(KeyValue { mod_revision: revision, ..kv(key, create_revision) }) }
    }

    fn entry(id: i64) -> Vec<u8> {
        entry_key(QUEUE, id)
    }

    /// A line read at `revision` with `entries`, `mine` this waiter's.
    fn line(entries: &[KeyValue], mine: Option<i64>, revision: i64, lock_held: bool, now: Instant) -> Line {
        let mut line = Line::new(LOCK.to_vec(), QUEUE.to_vec(), mine.map(entry), revision);
        line.load(entries);
        if !lock_held {
            line.lock_freed(now);
        }
        line
    }

    /// Three waiters, this one second: entries at revisions 10, 11 (mine), 12; read at 12.
    fn second_of_three(now: Instant) -> Line {
        line(&[kv(&entry(1), 10), kv(&entry(2), 11), kv(&entry(3), 12)], Some(2), 12, true, now)
    }

    #[test]
    fn the_first_waiter_goes_at_once_and_the_next_one_a_stagger_later() {
        let now = Instant::now();
        let mut first = line(&[kv(&entry(1), 10), kv(&entry(2), 11)], Some(1), 12, true, now);
        assert_eq!(first.turn(now), Turn::Wait { until: None }, "held: wait for the watch");
        first.see(&event(EVENT_DELETE, LOCK, 13), now);
        assert_eq!(first.turn(now), Turn::Go { passed: vec![] });

        let mut second = second_of_three(now);
        second.see(&event(EVENT_DELETE, LOCK, 13), now);
        assert_eq!(second.turn(now), Turn::Wait { until: Some(now + STAGGER) });
        assert_eq!(second.turn(now + STAGGER), Turn::Go { passed: vec![entry(1)] }, "the one ahead let it pass");
    }

    #[test]
    fn a_new_holder_ends_the_turn() {
        let now = Instant::now();
        let mut line = second_of_three(now);
        line.see(&event(EVENT_DELETE, LOCK, 13), now);
        line.see(&event(EVENT_PUT, LOCK, 14), now);
        assert_eq!(line.turn(now + STAGGER * 10), Turn::Wait { until: None });
    }

    /// An acquire that lost read the lock held at 15: the turn the watch showed is over, and
    /// the events it still carries from before are stale.
    #[test]
    fn a_lost_acquire_ends_the_turn_before_the_watch_shows_the_holder() {
        let now = Instant::now();
        let mut first = line(&[kv(&entry(1), 10)], Some(1), 12, true, now);
        first.see(&event(EVENT_DELETE, LOCK, 13), now);
        first.held_at(15);
        assert_eq!(first.turn(now), Turn::Wait { until: None });
        first.see(&event(EVENT_PUT, LOCK, 14), now);
        first.see(&event(EVENT_DELETE, LOCK, 13), now);
        assert_eq!(first.turn(now), Turn::Wait { until: None }, "stale events change nothing");
        first.see(&event(EVENT_DELETE, LOCK, 16), now);
        assert_eq!(first.turn(now), Turn::Go { passed: vec![] }, "the next release is a turn");
    }

    /// The winner's entry vanishes at the revision of its PUT; seen first, it moves no one up.
    #[test]
    fn the_rank_is_fixed_when_the_lock_is_freed() {
        let now = Instant::now();
        let mut line = second_of_three(now);
        line.see(&event(EVENT_DELETE, LOCK, 13), now);
        line.see(&event(EVENT_DELETE, &entry(1), 14), now);
        assert_eq!(line.turn(now), Turn::Wait { until: Some(now + STAGGER) });
        // At the next release it is first.
        line.see(&event(EVENT_PUT, LOCK, 14), now);
        line.see(&event(EVENT_DELETE, LOCK, 15), now);
        assert_eq!(line.turn(now), Turn::Go { passed: vec![] });
    }

    #[test]
    fn a_waiter_without_an_entry_comes_after_every_entry() {
        let now = Instant::now();
        let mut line = second_of_three(now);
        line.see(&event(EVENT_DELETE, &entry(2), 13), now);
        assert!(!line.in_queue());
        line.see(&event(EVENT_PUT, &entry(4), 14), now);
        line.see(&event(EVENT_DELETE, LOCK, 15), now);
        assert_eq!(line.turn(now + STAGGER * 2), Turn::Wait { until: Some(now + STAGGER * 3) });
        line.joined(entry(2), 16);
        assert!(line.in_queue());
        line.leave();
        assert!(!line.in_queue());
    }

    #[test]
    fn a_lock_free_at_the_first_read_is_a_turn_too() {
        let now = Instant::now();
        assert_eq!(line(&[kv(&entry(1), 10)], Some(1), 12, false, now).turn(now), Turn::Go { passed: vec![] });
        assert_eq!(line(&[], None, 12, false, now).turn(now), Turn::Go { passed: vec![] });
        let behind = line(&[kv(&entry(1), 10), kv(&entry(2), 11)], Some(2), 12, false, now);
        assert_eq!(behind.turn(now), Turn::Wait { until: Some(now + STAGGER) });
    }

    /// Entries of lock `a/b` share the prefix of lock `a`'s queue: they are not `a`'s.
    #[test]
    fn a_longer_lock_names_entries_are_not_in_line() {
        let now = Instant::now();
        let other = b"/p/queue/a/b/0000000000000007";
        let mut line = line(&[kv(other, 3), kv(&entry(1), 10)], Some(1), 12, true, now);
        line.see(&event(EVENT_PUT, other, 13), now);
        line.see(&event(EVENT_DELETE, LOCK, 14), now);
        assert_eq!(line.turn(now), Turn::Go { passed: vec![] });
        assert_eq!(entry_key(QUEUE, 0x1f), b"/p/queue/a/000000000000001f");
    }
}
