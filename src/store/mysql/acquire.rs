//! Acquire: the gated grant and, when it did not grant, why (the lock, or the epoch mark).

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row};
use tokio::time::Instant;

use super::epoch::{self, Mark, Verdict, MARK};
use super::{columns, duplicate, hint, micros, record_from, MySqlStore, ACQUIRE_ROUNDS};
use crate::store::{Acquire, Lease, LockRecord};

impl MySqlStore {
    /// One attempt at `lock` (the caller bounds it in time and retries what InnoDB undid).
    pub(super) async fn take(&self, lock: &str, identity: &str, ttl: Duration) -> sqlx::Result<Acquire> {
        // The winner also asks for the user locks (without waiting) in the same statement: SET is
        // evaluated only on the row it takes, so a loser never does. Whether it got them is only
        // a hint. The second one is named by the new token. Both granting statements are gated
        // on the epoch mark (see `epoch`).
        let table = self.bare_table();
        let take = &self.sql(&epoch::take_sql(&hint::name_sql(table), &hint::relief_sql(table, "{token}")));
        let get_lock = &self.sql(&format!(
            "DO GET_LOCK({}, 0), GET_LOCK({}, 0)",
            hint::name_sql(table),
            hint::relief_sql(table, "?")
        ));
        let create = &self.sql(&epoch::create_sql());
        let upsert = &self.sql(&epoch::upsert_sql());
        let won = |token| Acquire::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token });
        let mut conn = self.hints.connection_for_acquire().await?;
        let mut last = LockRecord::free(lock);
        let mut take_first = true;
        for _ in 0..ACQUIRE_ROUNDS {
            // Free, released or expired, and the mark allows it: take it. The affected-row
            // count is the verdict, and LAST_INSERT_ID(expr) hands back the token this very
            // statement wrote.
            if take_first {
                let done = sqlx::query(AssertSqlSafe(take.0.as_str()))
                    .bind(identity)
                    .bind(lock.as_bytes())
                    .bind(lock.as_bytes())
                    .bind(micros(ttl))
                    .bind(lock.as_bytes())
                    .bind(micros(ttl))
                    .execute(conn.conn())
                    .await?;
                if done.rows_affected() == 1 {
                    // The connection that holds the user lock leaves the pool with the lease.
                    self.hints.won(lock, Some(conn.detach()));
                    return Ok(won(done.last_insert_id()));
                }
            }
            take_first = true;
            let (record, mark, server) = self.read_with_mark(conn.conn(), lock).await?;
            let verdict = epoch::judge(mark.as_ref(), server, ttl);
            if verdict == Verdict::Write {
                // After a failover (or at a store's first acquire, or a longer ttl than any
                // before): one more statement, then look again.
                sqlx::query(AssertSqlSafe(upsert.0.as_str()))
                    .bind(micros(ttl))
                    .bind(micros(ttl))
                    .bind(micros(ttl))
                    .execute(conn.conn())
                    .await?;
            }
            match (record, verdict) {
                (Some(record), _) if record.is_held() => {
                    self.hints.saw(lock, record.token);
                    self.hints.spare(conn);
                    return Ok(Acquire::Held(record));
                }
                // The mark was just written: take again (or insert, for a lock never seen).
                (record, Verdict::Write) => take_first = record.is_some(),
                (record, Verdict::Grace(left)) => {
                    *self.grace.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + left);
                    self.hints.spare(conn);
                    let token = record.map_or(0, |record| record.token);
                    return Ok(Acquire::Held(LockRecord::after_failover(lock, token, left)));
                }
                // Freed or lapsed since the update looked: try again.
                (Some(record), Verdict::Grant) => last = record,
                // A name never seen: exactly one racer's insert succeeds.
                (None, Verdict::Grant) => match sqlx::query(AssertSqlSafe(create.0.as_str()))
                    .bind(lock.as_bytes())
                    .bind(identity)
                    .bind(micros(ttl))
                    .bind(micros(ttl))
                    .execute(conn.conn())
                    .await
                {
                    Ok(done) if done.rows_affected() == 1 => {
                        let token = done.last_insert_id();
                        // A lock name's first acquisition only: one more statement.
                        let hinted = sqlx::query(AssertSqlSafe(get_lock.0.as_str()))
                            .bind(lock.as_bytes())
                            .bind(lock.as_bytes())
                            .bind(token)
                            .execute(conn.conn())
                            .await;
                        if let Err(err) = hinted {
                            tracing::debug!("cannot take the user lock: {err}");
                        }
                        self.hints.won(lock, Some(conn.detach()));
                        return Ok(won(token));
                    }
                    // The mark changed since it was read: look again.
                    Ok(_) => take_first = false,
                    Err(err) if duplicate(&err) => {}
                    Err(err) => return Err(err),
                },
            }
        }
        // The lock kept changing hands under us: others are taking it.
        Ok(Acquire::Held(last))
    }

    /// After an acquire was not granted: the lock's record, the epoch mark and the server's
    /// `@@server_id`, in one statement (0 when the table is empty: then there is no mark).
    async fn read_with_mark(
        &self,
        conn: &mut MySqlConnection,
        lock: &str,
    ) -> sqlx::Result<(Option<LockRecord>, Option<Mark>, u64)> {
        let rows = sqlx::query(self.sql(&format!(
            "SELECT name, {}, TIMESTAMPDIFF(MICROSECOND, acquired_at, expires_at) AS longest_us,
                CAST(@@server_id AS UNSIGNED) AS this_server
             FROM {{t}} WHERE name IN (?, {})",
            columns(true),
            epoch::MARK_SQL
        )))
        .bind(lock.as_bytes())
        .fetch_all(&mut *conn)
        .await?;
        let (mut record, mut mark, mut server) = (None, None, 0);
        for row in &rows {
            server = row.try_get("this_server")?;
            let name: Vec<u8> = row.try_get("name")?;
            if name == MARK {
                mark = Some(Mark {
                    epoch: row.try_get("token")?,
                    fresh: row.try_get("kept")?,
                    left_us: row.try_get("left_us")?,
                    longest_us: row.try_get("longest_us")?,
                });
            } else {
                record = Some(record_from(lock.to_string(), row)?);
            }
        }
        Ok((record, mark, server))
    }
}
