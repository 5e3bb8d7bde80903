//! Whose turn: a release wakes one waiter at once; the others act only if it does not.
//!
//! Every waiter LISTENs on its own connection (opened on its first wait, kept across waits)
//! and marks that session as waiting for one lock: its `application_name` is
//! `leaderrun-wait:` and a digest of table and lock name (`waiting_name`, `REGISTER_SQL`). A
//! release that frees the lock picks, in the same statement, the session of this database
//! with that name that has been there longest (from `pg_stat_get_activity`, what
//! `pg_stat_activity` shows; `choose_sql`) and sends `NOTIFY leaderrun_turn,
//! '<pid>:<lock name>'`. The waiter whose session has that pid acts at once. Every other
//! waiter draws a stagger (`stagger`) and acts when it runs out, unless it has heard by then
//! that the lock was taken: a waiter that acts on a turn sends `NOTIFY leaderrun_turn,
//! 'taken:<lock name>'` in its acquire statement (`announced_sql`), whether it won or found
//! the lock held. A live waiter's acquire takes milliseconds, so the others hear it long before
//! their stagger ends and send nothing: a herd of a hundred waiters costs a handoff the
//! release and one acquire, not a read by each. A session gets its notifications in commit
//! order, and an acquire locks the row even when it finds it held, as a release does, so a
//! "taken" always comes after the turn it answers and before the next release's turn.
//!
//! What a waiter costs the others if it is frozen (SIGSTOP, a paused VM) or on a host that
//! vanished: its session stays, so it is named at every release until it thaws or the server
//! drops its connection (for a vanished host, when TCP gives up). Each such handoff costs the
//! others one stagger, at most `STAGGER_TO`: the first of them to act takes the lock, and its
//! "taken" stops the rest. A dead waiter's session is gone and is never named.
//!
//! A waiter that wins drops its listener, whose connection then closes (a moment later, off
//! the handoff's path). Until it has, its session is still marked: the release this holder
//! sends leaves its own former session out by pid, and nobody else releases its lease.
//!
//! Only a hint: the acquire statement stays the only way to the lease. When the release sees
//! no waiting session (behind a pooler, say, which names sessions its own way), the pid is 0
//! and every waiter acts, as before. A release by a leaderrun from
//! before the turns sends only the plain `NOTIFY leaderrun, '<lock name>'` (which is still
//! sent, for such waiters): a waiter that hears it and no turn within `TURN_GRACE` acts too.
//! Waiters from before the stagger ignore a "taken" (it names no pid).

use std::time::Duration;

use tokio::time::Instant;

/// The channel turns are announced on; the payload is `<pid>:<lock name>`, or
/// `taken:<lock name>` from a waiter that acted on one.
pub const TURN_CHANNEL: &str = "leaderrun_turn";

/// How long a waiter that heard a plain release waits for the turn that follows it before it
/// acts anyway (a releaser from before the turns sends none). Both are sent by one statement
/// and arrive together; this only covers a slow client.
pub const TURN_GRACE: Duration = Duration::from_millis(100);

/// The `application_name` of a session waiting for `lock` in table `quoted_table`: a prefix
/// and a 64-bit FNV-1a digest of both, in hex (an application name is at most 63 bytes, and a
/// lock name up to 255 characters). Two locks with one digest would only share a line: a
/// waiter picked for the other lock's release stays put, and this lock's waiters act after
/// their stagger, as when the one picked is frozen.
pub fn waiting_name(quoted_table: &str, lock: &str) -> String {
    let digest = [quoted_table.as_bytes(), b":", lock.as_bytes()]
        .concat()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3));
    format!("leaderrun-wait:{digest:016x}")
}

/// Mark this session as waiting (`$1`: its `waiting_name`), and say which pid it has.
pub const REGISTER_SQL: &str = "SELECT pg_backend_pid(), set_config('application_name', $1, false)";

/// An expression sending the turn for the lock named by SQL expression `lock`: to the session
/// of this database named `waiting` (SQL for its `waiting_name`) that has waited longest,
/// other than `releaser` (SQL for the pid of the releasing run's own former waiting session,
/// or 0), or to everyone (pid 0) if there is none. The function behind `pg_stat_activity` is
/// read directly: through the view's joins a release cost 0.42 ms more than without a turn,
/// this way 0.11 ms (pgbench against a local server).
pub fn choose_sql(lock: &str, waiting: &str, releaser: &str) -> String {
    format!(
        "pg_notify('{TURN_CHANNEL}', coalesce((SELECT a.pid FROM pg_stat_get_activity(NULL) a
            WHERE a.application_name = {waiting} AND a.pid <> {releaser}
              AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY a.backend_start NULLS LAST, a.pid LIMIT 1), 0) || ':' || {lock})"
    )
}

/// The shortest stagger: far longer than a handoff on a loaded host (the named waiter's
/// wake-up, its acquire, its "taken" reaching the others), so that a live named waiter is
/// almost never raced; short beside any lease, since it is what a frozen named waiter costs.
pub const STAGGER_FROM: Duration = Duration::from_millis(100);
/// The longest stagger. Each waiter draws its own between the two, so that when the named one
/// is frozen the first to act is usually alone for a while, and the others hear its "taken".
pub const STAGGER_TO: Duration = Duration::from_millis(300);

/// A random stagger for one turn.
pub fn stagger() -> Duration {
    use rand::Rng;
    rand::rng().random_range(STAGGER_FROM..STAGGER_TO)
}

/// The statement an acquire becomes when its waiter acts on a turn: `ctes`, the guarded
/// acquire's CTEs (`epoch::guarded_ctes`, ending with `won`, which returns the token if it
/// won), answered by `answer` (its columns), then "taken" for the lock named by SQL expression
/// `lock`, sent whatever the acquire found (refused by the epoch's grace too), and `on_win` (an
/// SQL expression) only if it won. Returns one row, its token NULL if the lock is held.
pub fn announced_sql(ctes: &str, answer: &str, lock: &str, on_win: &str) -> String {
    format!(
        "{ctes}
         SELECT {answer}, pg_notify('{TURN_CHANNEL}', '{TAKEN}:' || {lock}),
                (SELECT {on_win} FROM won)"
    )
}

/// What a "taken" carries where a turn carries a pid.
const TAKEN: &str = "taken";

/// A notification, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The plain release of a lock (every releaser sends it).
    Released(String),
    /// The turn for a lock: pid 0 for everyone.
    Turn { pid: u32, lock: String },
    /// A waiter acted on its turn: the lock has a holder again.
    Taken(String),
}

impl Note {
    pub fn parse(channel: &str, payload: &str) -> Option<Self> {
        if channel == TURN_CHANNEL {
            let (pid, lock) = payload.split_once(':')?;
            if pid == TAKEN {
                return Some(Note::Taken(lock.to_string()));
            }
            Some(Note::Turn { pid: pid.parse().ok()?, lock: lock.to_string() })
        } else {
            Some(Note::Released(payload.to_string()))
        }
    }
}

/// One waiter's reading of the notifications for its lock.
#[derive(Debug)]
pub struct Turns {
    /// This waiter's session.
    pid: u32,
    lock: String,
    /// A plain release heard, with no turn yet: act at this instant unless one comes.
    grace: Option<Instant>,
    /// Another waiter's turn: act at this instant unless the lock is taken first.
    stagger: Option<Instant>,
    /// When the last turn for this lock came: a plain release just after it is the same one.
    last_turn: Option<Instant>,
    /// This waiter acts on a turn: its next acquire tells the others (`take_acting`).
    acting: bool,
}

impl Turns {
    pub fn new(pid: u32, lock: &str) -> Self {
        Self { pid, lock: lock.to_string(), grace: None, stagger: None, last_turn: None, acting: false }
    }

    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// When this waiter acts if nothing more is heard.
    pub fn due(&self) -> Option<Instant> {
        match (self.grace, self.stagger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `due` came and nothing ended the wait: act.
    pub fn lapse(&mut self) {
        self.grace = None;
        self.stagger = None;
        self.acting = true;
    }

    /// Whether this waiter acts on a turn, so that its acquire is to announce "taken" (once).
    pub fn take_acting(&mut self) -> bool {
        std::mem::take(&mut self.acting)
    }

    /// Whether this waiter acts now on what it heard; `stagger` is how long it gives another
    /// waiter whose turn it is.
    pub fn heard(&mut self, note: Note, now: Instant, stagger: Duration) -> bool {
        match note {
            Note::Turn { pid, lock } if lock == self.lock => {
                self.grace = None;
                self.last_turn = Some(now);
                if pid == self.pid || pid == 0 {
                    self.stagger = None;
                    self.acting = true;
                    return true;
                }
                // Two turns before a "taken" (a revoke, then a release): the lock has been
                // waiting since the first.
                let at = now + stagger;
                self.stagger = Some(self.stagger.map_or(at, |pending| pending.min(at)));
                false
            }
            Note::Taken(lock) if lock == self.lock => {
                self.grace = None;
                self.stagger = None;
                false
            }
            Note::Released(lock) if lock == self.lock => {
                let same_as_the_turn = self.last_turn.is_some_and(|at| now.duration_since(at) < TURN_GRACE);
                if !same_as_the_turn && self.grace.is_none() {
                    self.grace = Some(now + TURN_GRACE);
                }
                false
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGGER: Duration = Duration::from_millis(200);

    fn turn(pid: u32, lock: &str) -> Note {
        Note::Turn { pid, lock: lock.into() }
    }

    fn released(lock: &str) -> Note {
        Note::Released(lock.into())
    }

    fn taken(lock: &str) -> Note {
        Note::Taken(lock.into())
    }

    #[test]
    fn waiting_names_fit_and_differ() {
        let name = waiting_name("\"leaderrun_locks\"", &"é".repeat(255));
        assert!(name.len() <= 63 && name.starts_with("leaderrun-wait:"), "{name}");
        assert_ne!(waiting_name("\"t\"", "a"), waiting_name("\"t\"", "b"));
        assert_ne!(waiting_name("\"t\"", "a"), waiting_name("\"u\"", "a"));
        // FNV-1a as published (checked with an independent implementation): waiters and releasers
        // of different builds must agree.
        assert_eq!(waiting_name("\"leaderrun_locks\"", "nightly"), "leaderrun-wait:97b7d208e38d6327");
    }

    #[test]
    fn notes() {
        assert_eq!(Note::parse("leaderrun", "a:b"), Some(released("a:b")));
        assert_eq!(Note::parse(TURN_CHANNEL, "42:a:b"), Some(turn(42, "a:b")));
        assert_eq!(Note::parse(TURN_CHANNEL, "taken:a:b"), Some(taken("a:b")));
        assert_eq!(Note::parse(TURN_CHANNEL, "x:a"), None);
        let sql = announced_sql("WITH won AS (INSERT x RETURNING token)", "(SELECT token FROM won)", "$1", "f($1)");
        assert!(sql.starts_with("WITH won AS (INSERT x RETURNING token)"), "{sql}");
        assert!(sql.contains("SELECT (SELECT token FROM won), pg_notify('leaderrun_turn', 'taken:' || $1)"), "{sql}");
        assert!(sql.contains("(SELECT f($1) FROM won)"), "{sql}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_named_waiter_acts_at_once_and_announces_it_once() {
        let now = Instant::now();
        let mut mine = Turns::new(7, "lock");
        assert!(!mine.heard(released("lock"), now, STAGGER));
        assert!(mine.heard(turn(7, "lock"), now, STAGGER), "its turn");
        assert_eq!(mine.due(), None);
        assert!(mine.take_acting(), "its acquire says the lock is taken");
        assert!(!mine.take_acting(), "and only that acquire");
    }

    #[tokio::test(start_paused = true)]
    async fn another_waiter_acts_after_its_stagger_unless_the_lock_was_taken() {
        let now = Instant::now();
        let mut other = Turns::new(8, "lock");
        assert!(!other.heard(released("lock"), now, STAGGER));
        assert!(!other.heard(turn(7, "lock"), now, STAGGER), "another's turn");
        assert_eq!(other.due(), Some(now + STAGGER), "unless waiter 7 takes it by then");
        assert!(!other.take_acting());
        // Waiter 7 is frozen: nothing more comes.
        tokio::time::advance(STAGGER).await;
        other.lapse();
        assert_eq!(other.due(), None);
        assert!(other.take_acting(), "it acts in 7's place, and says so");

        // Waiter 7 is alive: its "taken" ends the stagger.
        let mut other = Turns::new(8, "lock");
        other.heard(released("lock"), now, STAGGER);
        other.heard(turn(7, "lock"), now, STAGGER);
        assert!(!other.heard(taken("lock"), now + Duration::from_millis(3), STAGGER));
        assert_eq!(other.due(), None, "nothing to do");
        assert!(!other.take_acting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_waiter_named_at_every_release_costs_one_stagger_each() {
        let mut other = Turns::new(8, "lock");
        for _ in 0..3 {
            let now = Instant::now();
            other.heard(released("lock"), now, STAGGER);
            other.heard(turn(7, "lock"), now, STAGGER);
            assert_eq!(other.due(), Some(now + STAGGER));
            tokio::time::advance(STAGGER).await;
            other.lapse();
            assert!(other.take_acting());
            // It took the lock; its own "taken" comes back to its listener, and later it
            // releases; the next release names the frozen waiter again.
            other.heard(taken("lock"), Instant::now(), STAGGER);
            tokio::time::advance(Duration::from_secs(5)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_turn_before_the_lock_is_taken_keeps_the_first_stagger() {
        let now = Instant::now();
        let mut other = Turns::new(8, "lock");
        other.heard(turn(7, "lock"), now, STAGGER);
        other.heard(turn(9, "lock"), now + STAGGER / 2, STAGGER);
        assert_eq!(other.due(), Some(now + STAGGER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_for_everyone_or_for_another_lock() {
        let now = Instant::now();
        let mut waiter = Turns::new(7, "lock");
        assert!(!waiter.heard(turn(8, "other"), now, STAGGER));
        assert!(!waiter.heard(taken("other"), now, STAGGER));
        assert_eq!(waiter.due(), None, "another lock's turns are no concern");
        assert!(waiter.heard(turn(0, "lock"), now, STAGGER), "nobody was seen waiting: everyone acts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_release_without_a_turn_is_acted_on_after_the_grace() {
        let now = Instant::now();
        let mut waiter = Turns::new(7, "lock");
        assert!(!waiter.heard(released("lock"), now, STAGGER));
        assert_eq!(waiter.due(), Some(now + TURN_GRACE));
        // A second plain release does not push the moment back.
        assert!(!waiter.heard(released("lock"), now + TURN_GRACE / 2, STAGGER));
        assert_eq!(waiter.due(), Some(now + TURN_GRACE));
        waiter.lapse();
        assert_eq!(waiter.due(), None);
        assert!(waiter.take_acting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_release_right_after_its_turn_is_the_same_release() {
        let now = Instant::now();
        let mut waiter = Turns::new(8, "lock");
        waiter.heard(turn(7, "lock"), now, STAGGER);
        waiter.heard(taken("lock"), now, STAGGER);
        assert!(!waiter.heard(released("lock"), now + Duration::from_millis(1), STAGGER));
        assert_eq!(waiter.due(), None, "not acted on later either");
        // A plain release long after is a new one (from an older releaser).
        assert!(!waiter.heard(released("lock"), now + Duration::from_secs(5), STAGGER));
        assert!(waiter.due().is_some());
    }

    #[test]
    fn staggers_stay_in_range() {
        for _ in 0..100 {
            assert!((STAGGER_FROM..STAGGER_TO).contains(&stagger()));
        }
    }
}
