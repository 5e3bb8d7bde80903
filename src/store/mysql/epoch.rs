//! The epoch guard (docs/safety.md, "A store's own failover"): a replica promoted after it
//! missed the last writes of an asynchronous primary may show a lock free (or held by an older
//! lease) while the lost lease's child still runs, with the token counter gone back. So nothing
//! is granted on a new primary until every lease of the old one could have ended, and tokens
//! granted after a failover start from the server's clock.
//!
//! The epoch is `@@server_id`, the identity of the server taking the writes (MySQL and MariaDB
//! both have it; every server of a replicated set must have its own, which replication needs
//! anyway). The server reads it inside the statements that grant, so a statement replayed on a
//! replica never decides anything there: those statements read a system variable and take user
//! locks, which makes MIXED logging (MariaDB's default) log them as rows, and ROW (MySQL 8's
//! default) always does. `binlog_format=STATEMENT` is not supported.
//!
//! The epoch mark is a row of the lock table itself, so that a least-privileged user
//! (`SELECT, INSERT, UPDATE` on that one table) needs no other grant, under [`MARK`], a name no
//! lock can have (lock names never contain control characters). Its columns mean:
//!
//! | column | in the mark |
//! |---|---|
//! | `name` | `\x01epoch` |
//! | `holder` | NULL |
//! | `token` | the epoch: the `@@server_id` of the server that wrote it |
//! | `acquired_at` | when the epoch began (the server's `UTC_TIMESTAMP(6)`) |
//! | `expires_at` | when its grace ends: `acquired_at` + the longest ttl any acquire asked for |
//! | `revoked` | 0 |
//! | `kept` | fresh: 1 if the epoch began on an empty store (then there is no grace) |
//!
//! The granting statements (the conditional UPDATE, and the INSERT of a lock's first row) are
//! gated on the mark: it shows this server, it has recorded a ttl at least this acquire's, and
//! it is fresh or its grace is over. On the usual path that costs nothing: the same one
//! statement grants. Only when an acquire was not granted does the read that follows (which it
//! made already, to report the holder) also fetch the mark; when the mark is the reason (missing,
//! another server's, a ttl it has not recorded) the acquire upserts it ([`upsert_sql`]) and looks
//! again, and while the grace runs it is refused with the time left.
//!
//! A table leaderrun creates gets a fresh mark at once ([`create_mark_sql`]), so that even the
//! very first lease on a new store, lost with the primary that granted it, is guarded: the
//! promoted replica has the mark of the old server (the table's creation reached it), not none.

use std::time::Duration;

use super::micros;

/// The mark's name: a control character, which no lock name may have.
pub const MARK: &[u8] = b"\x01epoch";

/// [`MARK`] as an SQL literal.
pub const MARK_SQL: &str = "X'0165706F6368'";

/// The server's clock in microseconds since 1970, in SQL: TIMESTAMPDIFF between two DATETIMEs
/// does not depend on the session's time zone (UNIX_TIMESTAMP would).
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The condition under which the mark, as `m`, lets a grant through; binds the acquire's ttl.
const GATE: &str = "m.token = @@server_id AND m.expires_at >= m.acquired_at + INTERVAL ? MICROSECOND
       AND (m.kept OR m.expires_at <= UTC_TIMESTAMP(6))";

/// A lease's next token from its row `l`'s: one more, and on an epoch that did not begin on an
/// empty store, at least the server's clock in microseconds (the tokens a failover lost were
/// all given before it, a whole grace earlier).
pub fn next_token_sql() -> String {
    format!("CAST(IF(m.kept, l.token + 1, GREATEST(l.token + 1, {NOW_US})) AS UNSIGNED)")
}

/// The gated acquire: takes lock `l` if it is free or expired and the mark `m` allows it, and
/// (as the existing acquire did) asks for the user locks in the same statement. A self-join,
/// since MySQL refuses a subquery on the table being updated (error 1093). Multi-table UPDATEs
/// promise no order of assignment, so no assignment reads a column another one writes: the new
/// token is computed once for LAST_INSERT_ID and again for the second user lock's name, both
/// from the old one. `turn` and `relief` are the user locks' name expressions (`relief` with
/// `{token}` where the token goes); binds identity, lock (turn), lock (relief), ttl, lock, ttl.
pub fn take_sql(turn: &str, relief: &str) -> String {
    let next = next_token_sql();
    let relief = relief.replace("{token}", &next);
    format!(
        "UPDATE {{t}} l JOIN {{t}} m ON m.name = {MARK_SQL}
         SET l.holder = ?,
             l.token = LAST_INSERT_ID({next} + LEAST(0, IFNULL(GET_LOCK({turn}, 0), 0), IFNULL(GET_LOCK({relief}, 0), 0))),
             l.acquired_at = UTC_TIMESTAMP(6), l.expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
             l.revoked = 0, l.kept = 0
         WHERE l.name = ? AND (l.holder IS NULL OR l.expires_at <= UTC_TIMESTAMP(6)) AND {GATE}"
    )
}

/// The gated first row of a lock never seen: exactly one racer's succeeds (the others get a
/// duplicate key); none does while the mark does not allow it (0 rows). Its token goes through
/// LAST_INSERT_ID too. Binds lock, identity, ttl, ttl.
pub fn create_sql() -> String {
    format!(
        "INSERT INTO {{t}} (name, holder, token, acquired_at, expires_at, revoked)
         SELECT ?, ?, LAST_INSERT_ID(CAST(IF(m.kept, 1, GREATEST(1, {NOW_US})) AS UNSIGNED)),
                UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, 0
         FROM {{t}} AS m WHERE m.name = {MARK_SQL} AND {GATE}"
    )
}

/// Write the mark for this acquire, in one statement (the row lock orders racers):
/// - missing: this server's epoch beginning now, with this ttl; fresh if the table has no
///   other row (an older leaderrun's rows, or a mark lost with a primary, get a grace);
/// - another server's: this server's epoch beginning now, not fresh, the longest ttl kept;
/// - this server's: the longest ttl grown to this one.
///
/// Every assignment reads only columns not yet assigned (left to right), so MariaDB's
/// SIMULTANEOUS_ASSIGNMENT mode gives the same. The derived table is materialised (it has an
/// aggregate), which MySQL needs to read the table an INSERT writes. Binds ttl three times.
pub fn upsert_sql() -> String {
    format!(
        "INSERT INTO {{t}} (name, holder, token, acquired_at, expires_at, revoked, kept)
         SELECT {MARK_SQL}, NULL, @@server_id, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, 0, e.no_rows
         FROM (SELECT COUNT(*) = 0 AS no_rows FROM (SELECT 1 FROM {{t}} WHERE name <> {MARK_SQL} LIMIT 1) AS any_row) AS e
         ON DUPLICATE KEY UPDATE
           expires_at = IF(token = @@server_id, GREATEST(expires_at, acquired_at + INTERVAL ? MICROSECOND),
               UTC_TIMESTAMP(6) + INTERVAL GREATEST(TIMESTAMPDIFF(MICROSECOND, acquired_at, expires_at), ?) MICROSECOND),
           kept = IF(token = @@server_id, kept, 0),
           acquired_at = IF(token = @@server_id, acquired_at, UTC_TIMESTAMP(6)),
           token = @@server_id"
    )
}

/// The fresh mark of a table just created (ignored if some acquire wrote one first).
pub fn create_mark_sql(table: &str) -> String {
    format!(
        "INSERT IGNORE INTO `{table}` (name, holder, token, acquired_at, expires_at, revoked, kept)
    VALUES ({MARK_SQL}, NULL, @@server_id, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, 1)"
    )
}

/// What an acquire that was not granted read of the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The epoch it records.
    pub epoch: u64,
    pub fresh: bool,
    /// Microseconds until its grace ends (negative: over).
    pub left_us: i64,
    /// The longest ttl it records, in microseconds.
    pub longest_us: i64,
}

/// What the mark means for an acquire on server `server` asking for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The mark allows a grant: the lock decides.
    Grant,
    /// The mark must be written first (missing, another server's, a shorter ttl).
    Write,
    /// A new epoch's grace: nothing is granted for this long.
    Grace(Duration),
}

pub fn judge(mark: Option<&Mark>, server: u64, ttl: Duration) -> Verdict {
    match mark {
        None => Verdict::Write,
        Some(mark) if mark.epoch != server || mark.longest_us < micros(ttl) => Verdict::Write,
        Some(mark) if mark.fresh || mark.left_us <= 0 => Verdict::Grant,
        Some(mark) => Verdict::Grace(Duration::from_micros(mark.left_us as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(4);

    fn mark(epoch: u64, fresh: bool, left_us: i64, longest_us: i64) -> Mark {
        Mark { epoch, fresh, left_us, longest_us }
    }

    #[test]
    fn the_mark_literal_is_the_mark() {
        let hex: String = MARK.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(MARK_SQL, format!("X'{hex}'"));
        assert!(MARK.iter().any(u8::is_ascii_control), "no lock name may have it");
    }

    #[test]
    fn a_missing_mark_or_another_servers_is_written() {
        assert_eq!(judge(None, 1, TTL), Verdict::Write);
        assert_eq!(judge(Some(&mark(2, true, -5, 9_000_000)), 1, TTL), Verdict::Write);
    }

    #[test]
    fn a_longer_ttl_than_recorded_is_recorded_first() {
        assert_eq!(judge(Some(&mark(1, true, -5, 3_999_999)), 1, TTL), Verdict::Write);
        assert_eq!(judge(Some(&mark(1, true, -5, 4_000_000)), 1, TTL), Verdict::Grant);
    }

    #[test]
    fn the_grace_is_waited_out_unless_the_epoch_began_on_an_empty_store() {
        assert_eq!(
            judge(Some(&mark(1, false, 1_500, 4_000_000)), 1, TTL),
            Verdict::Grace(Duration::from_micros(1_500))
        );
        assert_eq!(judge(Some(&mark(1, true, 1_500, 4_000_000)), 1, TTL), Verdict::Grant);
        assert_eq!(judge(Some(&mark(1, false, 0, 4_000_000)), 1, TTL), Verdict::Grant);
    }

    #[test]
    fn the_statements_read_the_mark() {
        let take = take_sql("TURN(?)", "RELIEF(?, {token})");
        assert!(take.contains(MARK_SQL) && take.contains("m.token = @@server_id"), "{take}");
        assert!(take.contains(&format!("RELIEF(?, {})", next_token_sql())), "{take}");
        assert_eq!(take.matches('?').count(), 6, "{take}");
        assert_eq!(create_sql().matches('?').count(), 4);
        assert_eq!(upsert_sql().matches('?').count(), 3);
    }
}
