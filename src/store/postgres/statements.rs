//! The statements, one per step: each is one atomic statement on the server's clock
//! (`clock_timestamp()`), with the table name quoted in and the values bound.

use super::*;

/// The statements, with the table name quoted in and `$1`, `$2`... where `Sql::text` puts
/// the values.
pub(super) struct Sql {
    /// The table's name, quoted.
    pub(super) table: String,
    /// The acquire, on a server that states its epoch and on one that will not (`Sql::acquire`).
    acquires: [Acquire; 2],
    pub(super) renew: String,
    pub(super) release: String,
    pub(super) status: String,
    pub(super) list: String,
    /// `status` and `list` on a table from before the `kept` column.
    pub(super) status_before_kept: String,
    pub(super) list_before_kept: String,
    pub(super) revoke: String,
}

/// The acquire statement of one way of reading the epoch (`epoch::Epoch`).
struct Acquire {
    plain: String,
    /// By a waiter acting on a turn: it also tells the other waiters (`turns.rs`).
    announced: String,
}

/// A value put into a statement by `Sql::text`.
pub(super) enum Value<'a> {
    Text(&'a str),
    Int(i64),
}

impl Value<'_> {
    /// The value as an SQL literal. Text is dollar-quoted: the server reads everything between
    /// the tags as is (no escapes, whatever `standard_conforming_strings` says), and the tag is
    /// chosen so that the text cannot end the literal early. A NUL cannot be sent at all.
    pub(super) fn push_literal(&self, out: &mut String) -> std::result::Result<(), String> {
        match self {
            Value::Int(n) => out.push_str(&n.to_string()),
            Value::Text(text) => {
                if text.contains('\0') {
                    return Err("a name with a NUL character cannot be stored".into());
                }
                let mut tag = String::from("lr");
                while !ends_only_at_the_close(text, &tag) {
                    tag.push('x');
                }
                for part in ["$", &tag, "$", text, "$", &tag, "$"] {
                    out.push_str(part);
                }
            }
        }
        Ok(())
    }
}

/// Whether `$tag$text$tag$` ends where the closing tag starts, and not inside `text`.
pub(super) fn ends_only_at_the_close(text: &str, tag: &str) -> bool {
    let close = format!("${tag}$");
    format!("{text}{close}").find(&close) == Some(text.len())
}

impl Sql {
    /// `template` with each `$n` replaced by the n-th value as a literal, in one pass (a value
    /// that itself contains `$2` is never rewritten). The values come from this program (lock
    /// names, identities, numbers) and are quoted by `Value::push_literal`.
    pub(super) fn text(template: &str, values: &[Value<'_>]) -> std::result::Result<SqlStr, String> {
        let mut out = String::with_capacity(template.len() + 128);
        let mut rest = template;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            match after[..digits].parse::<usize>().ok().and_then(|n| values.get(n.checked_sub(1)?)) {
                Some(value) => {
                    value.push_literal(&mut out)?;
                    rest = &after[digits..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        Ok(AssertSqlSafe(Arc::<str>::from(out)).into_sql_str())
    }

    pub(super) fn new(table: &str) -> Self {
        let t = format!("\"{table}\"");
        // Unix microseconds and the time left, both computed on the server's clock.
        let columns = |kept: &str| {
            format!(
                "l.name, l.holder, l.token, l.revoked, {kept} AS kept,
            (extract(epoch FROM l.acquired_at) * 1000000)::bigint AS acquired_us,
            (extract(epoch FROM l.expires_at - c.now) * 1000000)::bigint AS left_us"
            )
        };
        // A table from before the `kept` column is read without it (`status` and `list` only
        // look: they add nothing to the table).
        let (columns, columns_before_kept) = (columns("l.kept"), columns("false"));
        // A won acquire tells watchers (`observe.rs`); a lost one changed nothing.
        let tell_watchers = format!("pg_notify('{CHANGE_CHANNEL}', $1)");
        // One clock reading for the whole statement. A row is taken over only if it was
        // released or has expired on the server's clock, and only once the epoch's grace
        // after a failover is over (`epoch.rs`); the token never resets.
        let acquire = |epoch| {
            let (guarded, answer) = (epoch::guarded_ctes(&t, epoch), epoch::ANSWER);
            Acquire {
                plain: format!("{guarded} SELECT {answer}, (SELECT {tell_watchers} FROM won)"),
                announced: turns::announced_sql(&guarded, answer, "$1", &tell_watchers),
            }
        };
        // The epoch's mark is not a lock.
        let not_the_mark = format!("WHERE l.name <> {}", epoch::MARK_SQL);
        let sql = |s: String| s;
        Self {
            table: t.clone(),
            acquires: [acquire(epoch::Epoch::Stated), acquire(epoch::Epoch::Unstated)],
            // A row kept for --min-hold has no child left: a renewal sent before its release
            // and arriving after it must not stretch the keep to a full ttl again. (The
            // acquire that made this lease already needed the `kept` column.)
            renew: sql(format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $1 * interval '1 microsecond'
                 WHERE name = $2 AND token = $3 AND holder = $4 AND NOT revoked AND NOT kept"
            )),
            // With keep > 0 (--min-hold) the row stays taken until acquired_at + keep if
            // that is still ahead, and watchers are told (`observe.rs`); otherwise it is
            // freed, and waiters are told (watchers hear that too).
            release: sql(format!(
                "WITH done AS (
                    UPDATE {t} l SET
                        holder = CASE WHEN l.acquired_at + $1 * interval '1 microsecond' > c.now
                                      THEN l.holder END,
                        expires_at = CASE WHEN l.acquired_at + $1 * interval '1 microsecond' > c.now
                                          THEN l.acquired_at + $1 * interval '1 microsecond' ELSE c.now END,
                        kept = l.acquired_at + $1 * interval '1 microsecond' > c.now
                    FROM (SELECT clock_timestamp() AS now) c
                    WHERE l.name = $2 AND l.token = $3 AND l.holder = $4
                    RETURNING l.holder)
                 SELECT pg_notify(CASE WHEN holder IS NULL THEN '{CHANNEL}' ELSE '{CHANGE_CHANNEL}' END, $2),
                        CASE WHEN holder IS NULL THEN {turn} END
                   FROM done",
                turn = turns::choose_sql("$2", "$6", "$5")
            )),
            status: sql(format!("SELECT {columns} FROM {t} l, (SELECT clock_timestamp() AS now) c WHERE l.name = $1")),
            list: sql(format!(
                "SELECT {columns} FROM {t} l, (SELECT clock_timestamp() AS now) c {not_the_mark} ORDER BY l.name"
            )),
            status_before_kept: format!(
                "SELECT {columns_before_kept} FROM {t} l, (SELECT clock_timestamp() AS now) c WHERE l.name = $1"
            ),
            list_before_kept: format!(
                "SELECT {columns_before_kept} FROM {t} l, (SELECT clock_timestamp() AS now) c {not_the_mark} \
                 ORDER BY l.name"
            ),
            // Compare-and-set on the token read: a lease taken in between is left alone. A
            // lease only kept for --min-hold has no child and no holder left to free it: it is
            // freed now; a live one is only asked to stand down. (SET reads the old row.)
            revoke: sql(format!(
                "WITH done AS (
                    UPDATE {t} SET
                        revoked = revoked OR NOT kept,
                        holder = CASE WHEN kept THEN NULL ELSE holder END,
                        expires_at = CASE WHEN kept THEN clock_timestamp() ELSE expires_at END,
                        kept = false
                    WHERE name = $1 AND token = $2 AND holder IS NOT NULL AND expires_at > clock_timestamp()
                    RETURNING name)
                 SELECT pg_notify('{CHANNEL}', name), {turn} FROM done",
                turn = turns::choose_sql("name", "$3", "0")
            )),
        }
    }
}

impl Sql {
    /// The acquire statement for `epoch`, `announced` when a waiter acts on its turn.
    pub(super) fn acquire(&self, epoch: epoch::Epoch, announced: bool) -> &str {
        let acquire = &self.acquires[(epoch == epoch::Epoch::Unstated) as usize];
        if announced {
            &acquire.announced
        } else {
            &acquire.plain
        }
    }
}

/// The table's definition, one statement without a trailing `;` (for `leaderrun init
/// --print-sql`). `table` must be a plain identifier (see `valid_table`).
pub fn schema_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
    name        text PRIMARY KEY,
    holder      text,                          -- NULL when released
    token       bigint NOT NULL,               -- fencing token: +1 on every acquisition, never reset
    acquired_at timestamptz NOT NULL,          -- server clock at acquisition
    expires_at  timestamptz NOT NULL,          -- server clock at which the lease lapses
    revoked     boolean NOT NULL DEFAULT false, -- `leaderrun release` asked the holder to stand down
    kept        boolean NOT NULL DEFAULT false  -- released, kept until expires_at for --min-hold
)"
    )
}

/// A row of the table as the store reports it.
pub(super) fn record_from(row: &PgRow) -> LockRecord {
    let holder: Option<String> = row.get("holder");
    let token: i64 = row.get("token");
    let revoked: bool = row.get("revoked");
    let kept: bool = row.get("kept");
    let acquired_us: i64 = row.get("acquired_us");
    let left_us: i64 = row.get("left_us");
    let live = holder.is_some() && left_us > 0;
    LockRecord {
        lock: row.get("name"),
        holder: holder.filter(|_| live),
        token: token as u64,
        held_since: live.then(|| UNIX_EPOCH + Duration::from_micros(acquired_us.max(0) as u64)),
        expires_in: live.then(|| Duration::from_micros(left_us as u64)),
        revoked: live && revoked,
        campaigner: None,
        kept: live && kept,
    }
}

pub(super) fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}
