//! The epoch guard (docs/safety.md, "A store's own failover"): an asynchronous standby that is
//! promoted may never have seen the last leases the old primary granted, so a new primary
//! grants nothing until every lease of the old one could have ended, and its tokens jump above
//! any the old one gave.
//!
//! The guard lives inside the acquire statement itself: no round trip is added. The statement
//! reads the server's epoch and the mark, decides whether the grace is over, writes the mark
//! when it must change and, only if the grace is over, makes the usual compare-and-set on the
//! lock's row. All its CTEs see one snapshot, so the gate is computed from the mark as that
//! snapshot shows it and the server's epoch now: a mark that shows the current epoch can only
//! have been written on this server since it took writes (nothing else writes this epoch), and
//! a later version of it still shows this epoch, with a beginning no later and a longest lease
//! no shorter. The mark's upsert itself is computed from the row it locks (the latest version),
//! so two acquires that both find a new epoch record one beginning, the first.
//!
//! **The epoch** is `SYSTEM_IDENTIFIER/TIMELINE`: the cluster's system identifier (from
//! `pg_control_system()`, which every role may call; every physical replica of a cluster shares
//! it, a cluster made by initdb, pg_upgrade or a logical copy has another) and the timeline of
//! the WAL being written now, `substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`, which a
//! promotion moves on (`pg_control_checkpoint()` would show it only after the next checkpoint).
//! On a standby these functions would fail, but the statement is refused as read-only (25006,
//! transient) before anything runs.
//!
//! **The mark** is a row of the lock table (the one table a least-privileged user may read and
//! write) under the name `MARK`, which no lock can have: lock names contain no control
//! character, and a slot's record (`slots.rs`) starts with its lock's name. `list` leaves it
//! out, and an acquire of that name is refused. Its columns mean:
//!
//! | column        | in the mark                                                          |
//! |---------------|----------------------------------------------------------------------|
//! | `holder`      | the epoch leases were last granted in (`SYSTEM_IDENTIFIER/TIMELINE`)  |
//! | `token`       | the longest store ttl any acquire asked for, in microseconds         |
//! | `acquired_at` | when that epoch began, on the server's clock (its first acquire)     |
//! | `expires_at`  | the same instant: the row never looks like a live lease, so releases, |
//! |               | revokes and earlier leaderruns' `status` and `list` leave it alone    |
//! | `kept`        | fresh: the epoch began on an empty store, so there is no grace        |
//! | `revoked`     | false                                                                 |
//!
//! **Fresh** means that no lease can have been lost: no mark, no lease rows, and a server on
//! timeline 1, which has never been promoted. A table missing on a promoted server (its
//! creation may have been among the lost writes, with the first lease) gets the grace once.
//! Tokens on a fresh epoch go 1, 2, 3; on any other, a grant's token is at least the server's
//! clock in microseconds since 1970, far above any token the first epoch could have reached.

use std::time::Duration;

use crate::store::LockRecord;

/// The mark's name (a U+0001 and "epoch").
pub const MARK: &str = "\u{1}epoch";

/// `MARK` as SQL (no control character in the statement's text).
pub(super) const MARK_SQL: &str = "(chr(1) || 'epoch')";

/// The columns of a guarded acquire's answer, in order: the token if it won (else NULL), and
/// the grace left in microseconds if the epoch's grace refused it (else NULL).
pub(super) const ANSWER: &str = "(SELECT token FROM won), (SELECT left_us FROM gate WHERE left_us > 0)";

/// How the statement learns the server's epoch: from the server's control data and WAL, or,
/// where the server will not tell (`is_unstated`), not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Epoch {
    Stated,
    /// Amazon Aurora refuses the WAL functions ("wal_level must be set to 'logical'", "currently
    /// not supported for Aurora"), and a hardened server may revoke them. Aurora's storage is
    /// shared, so a failover there loses no acknowledged write; elsewhere a promotion goes
    /// unnoticed, which the store says once, as a warning. The epoch is then one constant on the
    /// first timeline: a mark written by a server that did state its epoch still starts one
    /// grace (it shows another epoch), and none after that.
    Unstated,
}

impl Epoch {
    /// The SQL of the system identifier and the timeline, as the statement reads them.
    fn columns(self) -> (&'static str, &'static str) {
        match self {
            Epoch::Stated => (
                "(SELECT system_identifier FROM pg_control_system())::text",
                "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            ),
            Epoch::Unstated => ("'unstated'", "'00000001'"),
        }
    }
}

/// Whether a guarded acquire failed because the server will not run the functions that state
/// its epoch (not a transient failure, nor one of the lock table).
pub(super) fn is_unstated(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else { return false };
    let text = db.message().to_ascii_lowercase();
    ["pg_control_system", "pg_current_wal_lsn", "pg_walfile_name", "wal_level", "not supported for aurora"]
        .iter()
        .any(|name| text.contains(name))
}

/// Said once per store, when the server first refuses to state its epoch.
pub(super) fn warn_unstated(shown: &str, why: &str) {
    tracing::warn!(
        "PostgreSQL store {shown}: the server does not state its timeline ({why}); a failover that loses leases \
         cannot be noticed (none can on Aurora's shared storage)"
    );
}

/// The CTEs of a guarded acquire, ending with `won` (the token, if the lock was won) and
/// `gate` (`left_us`: the grace left, 0 once over). Values: `$1` the lock, `$2` the holder,
/// `$3` the store ttl in microseconds. `t` is the quoted table name.
pub(super) fn guarded_ctes(t: &str, epoch: Epoch) -> String {
    let (system, timeline) = epoch.columns();
    format!(
        "WITH c AS (
            SELECT clock_timestamp() AS now, {system} AS system, {timeline} AS timeline),
         e AS (
            SELECT now, (extract(epoch FROM now) * 1000000)::bigint AS now_us,
                   system || '/' || timeline AS epoch, timeline = '00000001' AS first_timeline
              FROM c),
         m AS (SELECT holder, token, acquired_at, kept FROM {t} WHERE name = {MARK_SQL}),
         g AS (
            SELECT e.now, e.now_us, e.epoch,
                   coalesce(m.holder = e.epoch, false) AS same,
                   coalesce(m.token, 0) AS longest,
                   CASE WHEN m.holder IS NULL
                        THEN e.first_timeline AND NOT EXISTS (SELECT 1 FROM {t} WHERE name <> {MARK_SQL})
                        ELSE m.holder = e.epoch AND m.kept END AS fresh,
                   e.now_us - (extract(epoch FROM m.acquired_at) * 1000000)::bigint AS age_us
              FROM e LEFT JOIN m ON true),
         gate AS (
            SELECT g.*, CASE WHEN g.fresh THEN 0
                             WHEN g.same THEN greatest(0, greatest(g.longest, $3) - g.age_us)
                             ELSE greatest(g.longest, $3) END AS left_us
              FROM g),
         mark AS (
            INSERT INTO {t} AS l (name, holder, token, acquired_at, expires_at, revoked, kept)
            SELECT {MARK_SQL}, gate.epoch, greatest(gate.longest, $3), gate.now, gate.now, false, gate.fresh
              FROM gate WHERE NOT gate.same OR gate.longest < $3
            ON CONFLICT (name) DO UPDATE SET
                holder = excluded.holder,
                token = greatest(l.token, excluded.token),
                acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE excluded.acquired_at END,
                expires_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE excluded.acquired_at END,
                revoked = false,
                kept = coalesce(l.holder = excluded.holder AND l.kept, false)
             WHERE l.holder IS DISTINCT FROM excluded.holder OR l.token < excluded.token),
         won AS (
            INSERT INTO {t} AS l (name, holder, token, acquired_at, expires_at, revoked, kept)
            SELECT $1, $2, CASE WHEN gate.fresh THEN 1 ELSE greatest(1, gate.now_us) END, gate.now,
                   gate.now + $3 * interval '1 microsecond', false, false
              FROM gate WHERE gate.left_us = 0
            ON CONFLICT (name) DO UPDATE SET
                holder = excluded.holder, token = greatest(l.token + 1, excluded.token),
                acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, revoked = false, kept = false
             WHERE l.holder IS NULL OR l.expires_at <= excluded.acquired_at
             RETURNING l.token)"
    )
}

/// What a refused acquire reports: the lock's record as read, or, while the epoch's grace
/// (`grace_us` left, if that refused it) keeps a lock free on this primary closed, a lease the
/// failover may have lost, so that a standby retries when the grace ends. A live lease the new
/// primary shows is reported as it is: its holder kept it across the failover.
pub(super) fn refused(record: LockRecord, grace_us: Option<i64>) -> LockRecord {
    match grace_us {
        Some(left) if !record.is_held() => {
            LockRecord::after_failover(&record.lock, record.token, Duration::from_micros(left.max(1) as u64))
        }
        _ => record,
    }
}

#[cfg(test)]
mod tests {
    use super::super::statements::Sql;
    use super::*;

    #[test]
    fn both_acquires_are_guarded() {
        let sql = Sql::new("t");
        for (epoch, announced) in
            [(Epoch::Stated, false), (Epoch::Stated, true), (Epoch::Unstated, false), (Epoch::Unstated, true)]
        {
            let acquire = sql.acquire(epoch, announced);
            assert!(acquire.starts_with(&guarded_ctes("\"t\"", epoch)), "{acquire}");
            assert!(acquire.contains(&format!("SELECT {ANSWER},")), "{acquire}");
            assert!(acquire.contains("FROM gate WHERE gate.left_us = 0"), "{acquire}");
        }
        assert!(sql.list.contains(&format!("WHERE l.name <> {MARK_SQL}")), "{}", sql.list);
        assert!(sql.list_before_kept.contains(&format!("WHERE l.name <> {MARK_SQL}")));
    }

    #[test]
    fn the_mark_is_no_lock_name_nor_a_slot() {
        assert!(crate::store::validate_lock_name(MARK).is_err());
        assert!(MARK.starts_with('\u{1}'), "a slot's record starts with its lock's name");
    }

    #[test]
    fn a_refusal_in_the_grace_reports_a_lease_the_failover_may_have_lost() {
        let free = LockRecord { token: 7, ..LockRecord::free("x") };
        let record = refused(free.clone(), Some(1_500_000));
        assert_eq!(record, LockRecord::after_failover("x", 7, Duration::from_millis(1500)));
        assert_eq!(refused(free.clone(), None), free, "no grace: the record as read");
        let held = LockRecord { holder: Some("a".into()), expires_in: Some(Duration::from_secs(3)), ..free };
        assert_eq!(refused(held.clone(), Some(1)), held, "a live lease the new primary has");
    }
}
