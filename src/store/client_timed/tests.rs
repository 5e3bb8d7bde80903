//! The client-timed core on tokio's paused clock: the shared conformance suite through
//! the core over in-memory records, then the cases only a client-timed store has (clocks
//! that run at different rates, wall clocks far apart, a record deleted or released by
//! another client).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::memory::MemoryRecords;
use super::{observation, ClientTimed, Record};
use crate::clock::{Clock, TokioClock};
use crate::store::{Acquire, Store};
use crate::timing::{CLOCK_DRIFT, MARGIN};

#[path = "../../../tests/conformance/mod.rs"]
mod conformance;

/// A wall clock on tokio's paused time, `offset` ahead of (or behind) true time.
fn wall(offset: Duration, behind: bool) -> Arc<dyn Fn() -> SystemTime + Send + Sync> {
    let origin = tokio::time::Instant::now();
    let epoch = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    Arc::new(move || if behind { epoch - offset } else { epoch + offset } + origin.elapsed())
}

/// An elapsed-time clock running at `rate` × true time.
struct Rated {
    inner: TokioClock,
    rate: f64,
}

impl Clock for Rated {
    fn now(&self) -> Duration {
        self.inner.now().mul_f64(self.rate)
    }
}

struct Memory {
    records: Arc<MemoryRecords>,
}

async fn memory() -> Memory {
    Memory { records: Arc::new(MemoryRecords::new(wall(Duration::ZERO, false))) }
}

impl Memory {
    fn client(&self, clock: Arc<dyn Clock>, wall: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Arc<ClientTimed> {
        Arc::new(ClientTimed::with_clocks(self.records.clone(), clock, wall))
    }
}

#[async_trait]
impl conformance::Harness for Memory {
    async fn open(&self) -> Arc<dyn Store> {
        self.client(Arc::new(TokioClock::new()), wall(Duration::ZERO, false))
    }
    async fn restart(&self) {}
}

crate::conformance_suite!(paused: memory());

const TTL: Duration = Duration::from_secs(10);

/// Acquire until won, every 10 ms; the true time elapsed when it was.
async fn take_over(store: &dyn Store, lock: &str, identity: &str) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        if let Acquire::Won(_) = store.acquire(lock, identity, TTL).await.unwrap() {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_fast_standby_never_takes_over_before_a_slow_holders_deadline() {
    let m = memory().await;
    let slow =
        m.client(Arc::new(Rated { inner: TokioClock::new(), rate: 1.0 - CLOCK_DRIFT }), wall(Duration::ZERO, false));
    let fast =
        m.client(Arc::new(Rated { inner: TokioClock::new(), rate: 1.0 + CLOCK_DRIFT }), wall(Duration::ZERO, false));
    slow.acquire("job", "holder", TTL).await.unwrap();
    let taken = take_over(&*fast, "job", "standby").await;
    // The holder stops its child at ttl·(1 − 2ρ) − margin on its own (slow) clock.
    let holders_deadline = (TTL.mul_f64(1.0 - 2.0 * CLOCK_DRIFT) - MARGIN).div_f64(1.0 - CLOCK_DRIFT);
    assert!(taken > holders_deadline, "taken at {taken:?}, the holder ran until {holders_deadline:?}");
    // And no later than one observation on the standby's clock, plus one poll.
    assert!(taken <= observation(10).div_f64(1.0 + CLOCK_DRIFT) + Duration::from_millis(20), "{taken:?}");
}

#[tokio::test(start_paused = true)]
async fn wall_clocks_hours_apart_change_nothing_and_a_keep_is_judged_on_the_servers_clock() {
    let m = memory().await;
    let hour = Duration::from_secs(3600);
    let ahead = m.client(Arc::new(TokioClock::new()), wall(hour, false));
    let behind = m.client(Arc::new(TokioClock::new()), wall(hour, true));
    ahead.acquire("job", "ahead", TTL).await.unwrap();
    // A holder whose wall clock is an hour ahead is timed like any other.
    assert_eq!(take_over(&*behind, "job", "behind").await, observation(10));

    // A keep written by a host whose wall clock is an hour behind still ends on time.
    let lease = take(&*behind, "cron", "behind").await;
    behind.release(&lease, Duration::from_secs(10)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        matches!(ahead.acquire("cron", "late", TTL).await.unwrap(), Acquire::Held(_)),
        "a late host of the same firing"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(matches!(ahead.acquire("cron", "next", TTL).await.unwrap(), Acquire::Won(_)), "the next firing, at once");
}

#[tokio::test(start_paused = true)]
async fn a_first_sight_is_unproven_and_a_change_proves_the_holder_alive() {
    let m = memory().await;
    let (holder, standby) = (m.client(Arc::new(TokioClock::new()), wall(Duration::ZERO, false)), memory_client(&m));
    let lease = take(&*holder, "job", "holder").await;
    match standby.acquire("job", "standby", TTL).await.unwrap() {
        Acquire::Unproven { record, decide_in } => {
            assert_eq!((record.holder.as_deref(), decide_in), (Some("holder"), observation(10)))
        }
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    holder.renew(&lease, TTL).await.unwrap();
    assert!(matches!(standby.acquire("job", "standby", TTL).await.unwrap(), Acquire::Held(_)));
}

fn memory_client(m: &Memory) -> Arc<ClientTimed> {
    m.client(Arc::new(TokioClock::new()), wall(Duration::ZERO, false))
}

/// A client with records of its own (the same store), so its requests can be counted.
fn counted_client(m: &Memory) -> (Arc<MemoryRecords>, Arc<ClientTimed>) {
    let records = Arc::new(m.records.client());
    let client = ClientTimed::with_clocks(records.clone(), Arc::new(TokioClock::new()), wall(Duration::ZERO, false));
    (records, Arc::new(client))
}

/// Acquire, which must win at once.
async fn take(store: &dyn Store, lock: &str, identity: &str) -> crate::store::Lease {
    match store.acquire(lock, identity, TTL).await.unwrap() {
        Acquire::Won(lease) => lease,
        other => panic!("{identity} expected to win {lock:?}: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn client_gos_release_frees_at_once_and_tokens_outgrow_a_deleted_record() {
    let m = memory().await;
    let store = memory_client(&m);
    let first = take(&*store, "job", "a").await;
    // client-go takes it over (no token), then releases it as ReleaseOnCancel does.
    let go = Record { holder: "go-controller".into(), ttl_seconds: 15, transitions: 1, ..Record::default() };
    m.records.put("job", go.clone());
    assert!(matches!(store.acquire("job", "b", TTL).await.unwrap(), Acquire::Unproven { .. }));
    m.records.put("job", Record { holder: String::new(), ..go });
    let second = match store.acquire("job", "b", TTL).await.unwrap() {
        Acquire::Won(lease) => lease,
        other => panic!("a released record must be free at once: {other:?}"),
    };
    assert!(second.token > first.token);
    assert_eq!(m.records.get("job").unwrap().transitions, 2, "client-go's leaseTransitions counted on");
    // `kubectl delete lease`: the record and its token are gone, the version sequence is not.
    m.records.delete("job");
    let third = take(&*store, "job", "c").await;
    assert!(third.token > second.token, "{} after {}", third.token, second.token);
}

/// As the elector waits: acquire, and when held, wait for a change (the store's `changed`
/// returns by itself when the lease it saw would lapse), up to `until` in all.
async fn wait_for_turn(store: &dyn Store, lock: &str, identity: &str, until: Duration) -> Option<Duration> {
    let started = tokio::time::Instant::now();
    while started.elapsed() < until {
        if let Acquire::Won(_) = store.acquire(lock, identity, TTL).await.unwrap() {
            return Some(started.elapsed());
        }
        store.changed(lock, until.saturating_sub(started.elapsed())).await;
    }
    None
}

#[tokio::test(start_paused = true)]
async fn an_idle_standby_asks_nothing_beyond_its_watch_and_still_sees_the_holder_die() {
    let m = memory().await;
    let (standby_records, standby) = counted_client(&m);
    let holder = memory_client(&m);
    let lease = take(&*holder, "job", "holder").await;
    // The holder renews every 3 s for a minute, then dies; the server ends watches at 30 s.
    let records = m.records.clone();
    tokio::spawn(async move {
        for i in 1..=20 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(holder.renew(&lease, TTL).await.unwrap(), crate::store::Renew::Renewed);
            if i == 10 {
                records.end_watches();
            }
        }
    });
    assert_eq!(wait_for_turn(&*standby, "job", "standby", Duration::from_secs(59)).await, None);
    let asked = |kind| standby_records.count(kind);
    assert_eq!((asked("read"), asked("watch"), asked("changed")), (1, 2, 0), "one read, one watch (reopened once)");
    assert_eq!(asked("replace") + asked("create"), 0);
    // The last renewal was at 60 s: the standby takes over one observation after it saw it.
    let taken = wait_for_turn(&*standby, "job", "standby", Duration::from_secs(60)).await.expect("taken over");
    assert!(taken >= observation(10), "{taken:?}");
    assert!(taken <= observation(10) + Duration::from_secs(2), "{taken:?}");
}

#[tokio::test(start_paused = true)]
async fn a_release_seen_on_the_watch_is_taken_with_one_write() {
    let m = memory().await;
    let (standby_records, standby) = counted_client(&m);
    let holder = memory_client(&m);
    let lease = take(&*holder, "job", "holder").await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        holder.release(&lease, Duration::ZERO).await.unwrap();
    });
    let taken = wait_for_turn(&*standby, "job", "standby", Duration::from_secs(60)).await;
    assert_eq!(taken, Some(Duration::from_secs(5)), "woken by the watch at the release");
    // The first sight was read; the release came on the watch, and one guarded write took it.
    assert_eq!((standby_records.count("read"), standby_records.count("replace")), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_holder_releases_with_one_write_and_a_keep_reads_the_servers_clock_first() {
    let m = memory().await;
    let (records, holder) = counted_client(&m);
    let lease = take(&*holder, "job", "holder").await;
    let before = (records.count("read"), records.count("replace"));
    holder.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!((records.count("read") - before.0, records.count("replace") - before.1), (0, 1));
    assert!(m.records.get("job").unwrap().is_released());

    let lease = take(&*holder, "cron", "holder").await;
    let before = records.count("read");
    holder.release(&lease, Duration::from_secs(10)).await.unwrap();
    assert_eq!(records.count("read") - before, 1, "a keep ends on the server's clock: read it");
    assert!(m.records.get("cron").unwrap().kept_until.is_some());
}

/// A client of the memory records that cannot watch and is polled every second.
fn polled_client(m: &Memory) -> (Arc<MemoryRecords>, Arc<ClientTimed>) {
    let records = Arc::new(m.records.polled_client(Duration::from_secs(1)));
    let client = ClientTimed::with_clocks(records.clone(), Arc::new(TokioClock::new()), wall(Duration::ZERO, false));
    (records, Arc::new(client))
}

/// Where the store cannot watch, an idle standby reads at most once a second, and a renewal
/// its poll sees costs no second read: the poll's read is what the standby judges.
#[tokio::test(start_paused = true)]
async fn a_polled_standby_reads_at_most_once_a_second_and_still_sees_the_holder_die() {
    let m = memory().await;
    let (standby_records, standby) = polled_client(&m);
    let holder = memory_client(&m);
    let lease = take(&*holder, "job", "holder").await;
    // The holder renews every 3 s for a minute, then dies.
    tokio::spawn(async move {
        for _ in 1..=20 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(holder.renew(&lease, TTL).await.unwrap(), crate::store::Renew::Renewed);
        }
    });
    assert_eq!(wait_for_turn(&*standby, "job", "standby", Duration::from_secs(59)).await, None);
    // The first look, then a poll every 1 to 1.5 s, and no other read: a re-read after a
    // renewal a poll saw would follow that poll at once.
    let reads = standby_records.times("read");
    assert!((40..=60).contains(&reads.len()), "{} reads in 59 s", reads.len());
    let closest = reads.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    assert!(closest >= Duration::from_secs(1), "two reads {closest:?} apart");
    assert_eq!(standby_records.count("replace") + standby_records.count("create"), 0);
    // The last renewal was at 60 s: the standby takes over one observation after a poll saw it.
    let taken = wait_for_turn(&*standby, "job", "standby", Duration::from_secs(60)).await.expect("taken over");
    assert!(taken >= observation(10), "{taken:?}");
    assert!(taken <= observation(10) + Duration::from_secs(3), "{taken:?}");
}

/// A release a poll sees is taken with one write and no read of its own.
#[tokio::test(start_paused = true)]
async fn a_release_seen_by_a_poll_is_taken_with_one_write() {
    let m = memory().await;
    let (standby_records, standby) = polled_client(&m);
    let holder = memory_client(&m);
    let lease = take(&*holder, "job", "holder").await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        holder.release(&lease, Duration::ZERO).await.unwrap();
    });
    let taken = wait_for_turn(&*standby, "job", "standby", Duration::from_secs(60)).await.expect("taken");
    assert!(taken >= Duration::from_secs(5) && taken <= Duration::from_millis(6500), "{taken:?}");
    assert_eq!(standby_records.count("replace"), 1, "one guarded write took it");
}

/// The review's sequence: B reads (no record) and its create is held up; A reads, creates and
/// runs; the record is deleted; then B's create lands on the empty name. B's token must still
/// be above A's, or B's create must not count.
#[tokio::test(start_paused = true)]
async fn a_create_that_lands_after_a_deleted_record_gets_a_token_above_it() {
    let m = memory().await;
    let (slow, b) = counted_client(&m);
    let gate = slow.gate_next_create();
    let b_acquires = tokio::spawn(async move { b.acquire("job", "b", TTL).await.unwrap() });
    while slow.count("create") == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await; // B has read and is held at its create
    }
    let a = take(&*memory_client(&m), "job", "a").await;
    m.records.delete("job");
    gate.send(()).unwrap();
    let Acquire::Won(b) = b_acquires.await.unwrap() else { panic!("B's create landed on an empty name") };
    assert!(b.token > a.token, "B ran with token {} after A's {}", b.token, a.token);
    assert_eq!(m.records.get("job").unwrap().token, Some(b.token), "the token written is the one handed out");
    assert_eq!(slow.count("replace"), 1, "raised in one guarded write");
}

/// A create that nothing overtook keeps its token: one request, no rewrite.
#[tokio::test(start_paused = true)]
async fn a_create_nothing_overtook_is_one_write() {
    let m = memory().await;
    let (records, store) = counted_client(&m);
    take(&*store, "job", "a").await;
    assert_eq!((records.count("create"), records.count("replace")), (1, 0));
}

/// A keep's end is written from the server's clock, which an HTTP `Date` gives in whole
/// seconds: without rounding up, a keep released half a second into a second would end half
/// a second early, and a late host of the same cron firing would run the job again.
#[tokio::test(start_paused = true)]
async fn a_keep_on_a_server_clock_of_whole_seconds_never_ends_early() {
    let records = Arc::new(MemoryRecords::with_resolution(wall(Duration::ZERO, false), Duration::from_secs(1)));
    let client = || {
        Arc::new(ClientTimed::with_clocks(records.clone(), Arc::new(TokioClock::new()), wall(Duration::ZERO, false)))
    };
    let (first, late) = (client(), client());
    let keep = Duration::from_secs(2);
    // Half a second into a server second: its Date reads the second's start.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acquired = tokio::time::Instant::now();
    let lease = take(&*first, "cron", "first").await;
    tokio::time::sleep(Duration::from_millis(300)).await; // a short job
    first.release(&lease, keep).await.unwrap();
    // The late host tries every 10 ms: it may take the lock only once the keep asked for is over.
    let waited = take_over(&*late, "cron", "late").await;
    let won_at = tokio::time::Instant::now() - acquired;
    assert!(won_at >= keep, "the keep of {keep:?} ended after {won_at:?} (the late host waited {waited:?})");
}

/// Where floors come from the server's clock (S3, DynamoDB, Cloud Storage), a token above the
/// floor of the second it was written in counts only once that second is over, whichever
/// write carried it. Within one server second: A1 creates (the next second's floor + 1) but
/// the read that would settle it fails, so A1 gives the record back; A2 takes the released
/// record with one more; the record is deleted; A3 creates with the next second's floor + 1
/// again. Had A2 run at once, A3 would run after it with a smaller token.
#[tokio::test(start_paused = true)]
async fn a_token_above_its_seconds_floor_counts_only_once_that_second_is_over() {
    let records = Arc::new(MemoryRecords::with_server_seconds(wall(Duration::ZERO, false)));
    let client = |records: MemoryRecords| {
        Arc::new(ClientTimed::with_clocks(Arc::new(records), Arc::new(TokioClock::new()), wall(Duration::ZERO, false)))
    };
    tokio::time::sleep(Duration::from_millis(100)).await; // a tenth into a server second
    let a1_records = records.client();
    a1_records.fail_read_after_next_create();
    let a1 = client(a1_records);
    assert!(a1.acquire("job", "a1", TTL).await.is_err(), "A1's settle read failed");
    // As the elector does after an acquire that failed: give back whatever it may have won.
    a1.abandon("job", "a1").await.unwrap();
    assert!(records.get("job").unwrap().is_released());
    let a2 = take(&*client(records.client()), "job", "a2").await;
    records.delete("job");
    let a3 = take(&*client(records.client()), "job", "a3").await;
    assert!(a3.token > a2.token, "A3 ran with token {} after A2's {}", a3.token, a2.token);
}
