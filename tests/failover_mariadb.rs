//! The failover suite (tests/failover) against MariaDB replicated: a primary and a replica
//! behind a moving endpoint, asynchronous (every scenario, the lost writes included) and
//! semi-synchronous (a lease the replica had survives). Each test starts its own servers.

mod failover;
mod servers;

use servers::mariadb_replicated::MariadbReplicated;

mod asynchronous {
    use super::*;

    failover_suite!(asynchronous: MariadbReplicated::start());
}

mod semi_synchronous {
    use super::*;

    failover_suite!(synchronous: MariadbReplicated::start_semi_sync());
}

/// A table an earlier leaderrun made has leases but no epoch mark: the first acquire of this
/// version cannot tell whether a failover lost the mark, so it waits one lease out (once), and
/// the tokens granted then come from the server's clock. A table without a mark and without
/// rows is a new store: no wait, tokens 1, 2, 3.
mod without_a_mark {
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use leaderrun::store::{registry, Access, Acquire, FAILOVER_GRACE_HOLDER};

    use crate::servers::mariadb::Mariadb;

    const TTL: Duration = Duration::from_secs(2);

    /// The table as an earlier leaderrun made it: `schema_sql`'s CREATE TABLE alone.
    fn table_without_mark(db: &Mariadb) {
        let schema = leaderrun::store::mysql::schema_sql("leaderrun_locks");
        let create = schema.split(";\n").next().unwrap();
        db.root_sql(&format!("USE leaderrun; {create}"));
    }

    async fn acquire(db: &Mariadb, lock: &str) -> Acquire {
        let store = registry::parse_url(&db.url()).unwrap().open(Access::Create).await.expect("open");
        store.acquire(lock, "me", TTL).await.expect("acquire")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_of_an_earlier_version_are_waited_out_once() {
        let db = tokio::task::spawn_blocking(Mariadb::start).await.unwrap();
        table_without_mark(&db);
        db.root_sql(
            "INSERT INTO leaderrun.leaderrun_locks (name, holder, token, acquired_at, expires_at)
             VALUES ('old', NULL, 7, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        );
        let asked = Instant::now();
        match acquire(&db, "old").await {
            Acquire::Held(record) => {
                assert_eq!(record.holder.as_deref(), Some(FAILOVER_GRACE_HOLDER), "{record:?}");
                assert_eq!(record.token, 7, "{record:?}");
                assert!(record.expires_in.is_some_and(|left| left <= TTL), "{record:?}");
            }
            other => panic!("granted at once on a table whose leases may still run: {other:?}"),
        }
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let lease = loop {
            match acquire(&db, "old").await {
                Acquire::Won(lease) => break lease,
                Acquire::Held(_) if asked.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(asked.elapsed() >= TTL, "granted after {:?}", asked.elapsed());
        assert!(lease.token >= before, "token {} below the clock's {before} µs", lease.token);
        // Once: a lock never seen is then granted at once, its token from the clock too.
        match acquire(&db, "new").await {
            Acquire::Won(lease) => assert!(lease.token > before, "{lease:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_table_without_a_mark_is_a_new_store() {
        let db = tokio::task::spawn_blocking(Mariadb::start).await.unwrap();
        table_without_mark(&db);
        for expected in 1..=3 {
            match acquire(&db, "fresh").await {
                Acquire::Won(lease) => {
                    assert_eq!(lease.token, expected);
                    let store = registry::parse_url(&db.url()).unwrap().open(Access::Create).await.unwrap();
                    store.release(&lease, Duration::ZERO).await.unwrap();
                }
                other => panic!("{other:?}"),
            }
        }
        let listed = registry::parse_url(&db.url()).unwrap().open(Access::Create).await.unwrap().list().await.unwrap();
        assert_eq!(listed.iter().map(|r| r.lock.as_str()).collect::<Vec<_>>(), ["fresh"], "the mark is never listed");
    }
}
