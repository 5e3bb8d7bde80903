//! The state machine on tokio's paused clock, against the in-memory store.
//!
//! Every instant below is exact: with the clock paused, time moves only when
//! every task is idle, so "the stop signal came at 8.7 s" is a fact, not a race.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::*;
use crate::clock::TokioClock;
use crate::store::client_timed::memory::MemoryRecords;
use crate::store::client_timed::{observation, ClientTimed, Record as ClientRecord};
use crate::store::memory::{Behaviour, MemoryStore};
use recorder::{Event, Recorder};

mod recorder;

const LOCK: &str = "job";

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

struct Setup {
    clock: Arc<dyn Clock>,
    store: Arc<MemoryStore>,
    signals: mpsc::UnboundedSender<Signal>,
    receiver: Option<mpsc::UnboundedReceiver<Signal>>,
}

fn setup() -> Setup {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let (signals, receiver) = mpsc::unbounded_channel();
    Setup { clock, store, signals, receiver: Some(receiver) }
}

/// ttl 10 s, renew every 2 s, kill after 1 s: safe lease 9.8 s − margin.
fn timing(min_hold: Duration) -> Timing {
    timing_of(secs(10.0), secs(2.0), secs(1.0), min_hold)
}

fn timing_of(ttl: Duration, renew_every: Duration, kill_after: Duration, min_hold: Duration) -> Timing {
    crate::timing::Requested {
        ttl: Some(ttl),
        renew_every: Some(renew_every),
        kill_after: Some(kill_after),
        min_hold: Some(min_hold),
        server_skew: Duration::ZERO,
        waiting: true,
        failover: Duration::ZERO,
        lock_delay: Duration::ZERO,
    }
    .timing()
    .unwrap()
}

impl Setup {
    fn elector(&mut self, identity: &str, mode: Mode, min_hold: Duration) -> Elector {
        self.elector_with(identity, mode, timing(min_hold))
    }

    /// With leaderrun's own kind of identity (unique), unless `identity` starts with "chosen".
    fn elector_with(&mut self, identity: &str, mode: Mode, timing: Timing) -> Elector {
        let election = Election {
            lock: LOCK.into(),
            identity: identity.into(),
            unique_identity: !identity.starts_with("chosen"),
            timing,
            mode,
            stop: Signal::SIGTERM,
            max_runtime: None,
            heartbeat: None,
            slots: 1,
        };
        let receiver = self.receiver.take().unwrap_or_else(|| mpsc::unbounded_channel().1);
        Elector::new(self.store.clone(), self.clock.clone(), election, receiver)
    }

    fn recorder(&self, runs_for: Option<Duration>, obeys_stop: bool) -> Recorder {
        Recorder::new(self.clock.clone(), runs_for, obeys_stop)
    }
}

mod client_timed;
mod cool_down;
mod lock_delay;
mod max_runtime;
mod observed;
mod one_shot;
mod slots;

/// A one-shot run without --timeout that does not retry a failing store.
fn once() -> Mode {
    Mode::OneShot { until: None, retry_until: Duration::ZERO }
}

fn safe() -> Duration {
    timing(Duration::ZERO).safe_lease()
}

#[tokio::test(start_paused = true)]
async fn wait_mode_releases_at_once_on_a_clean_exit() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(5.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(s.store.expiry(LOCK), None, "the lease must be free at once");
    // Renewed at 2 s and 4 s, each deadline anchored at its send time.
    assert_eq!(child.extends(), vec![(secs(2.0), secs(2.0) + safe()), (secs(4.0), secs(4.0) + safe())]);
}

#[tokio::test(start_paused = true)]
async fn deadline_is_anchored_at_send_time_not_at_the_answer() {
    let mut s = setup();
    // Every renewal is applied at once but answered 1.5 s later.
    s.store.set_renew(Behaviour::Late(secs(1.5)));
    let mut child = s.recorder(Some(secs(7.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let extends = child.extends();
    assert!(!extends.is_empty());
    // The first renewal is sent at 2 s and confirmed at 3.5 s: the deadline is 2 s + safe lease.
    assert_eq!(extends[0], (secs(3.5), secs(2.0) + safe()));
    // The next is sent renew_every after the previous SEND, not after its answer.
    assert_eq!(extends[1], (secs(5.5), secs(4.0) + safe()));
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_never_move_the_deadline_and_the_child_is_stopped_then_killed() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Fail);
    // A child that ignores the stop signal: only SIGKILL ends it.
    let mut child = s.recorder(None, false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::LeaseLost { exit: ChildExit::Signal(9), .. }), "{outcome:?}");
    assert!(child.extends().is_empty(), "a failed renewal moved the deadline: {:?}", child.extends());
    let deadline = safe();
    assert_eq!(child.signals(), vec![(deadline - secs(1.0), Signal::SIGTERM)]);
    assert_eq!(child.kills(), vec![deadline]);
    // Renewals were retried until the stop.
    let renewals = s.store.calls.lock().unwrap().iter().filter(|(_, op)| op.starts_with("renew")).count();
    assert!(renewals > 3, "only {renewals} renewal attempts");
}

#[tokio::test(start_paused = true)]
async fn a_hung_renewal_still_stops_at_deadline_minus_grace_and_kills_at_the_deadline() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Hang);
    let mut child = s.recorder(None, false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::LeaseLost { .. }), "{outcome:?}");
    let deadline = safe();
    assert!(child.extends().is_empty());
    assert_eq!(child.signals(), vec![(deadline - secs(1.0), Signal::SIGTERM)]);
    assert_eq!(child.kills(), vec![deadline]);
}

#[tokio::test(start_paused = true)]
async fn a_child_that_obeys_the_stop_signal_is_not_killed() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Fail);
    let mut child = s.recorder(None, true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::LeaseLost { exit: ChildExit::Signal(15), .. }), "{outcome:?}");
    assert!(child.kills().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_child_ended_at_the_stop_time_by_someone_else_is_still_a_lost_lease() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Fail);
    // The watchdog's signal ends the child at the stop time, before the elector's own
    // timer for that instant has been looked at.
    let mut child = s.recorder(Some(safe() - secs(1.0)), false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::LeaseLost { .. }), "{outcome:?}");
    assert!(child.signals().is_empty(), "the elector had not signalled yet: {:?}", child.events());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_recovers_in_time_keeps_the_child_running() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Fail);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(6.0)).await;
        store.set_renew(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(12.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert!(child.signals().is_empty() && child.kills().is_empty(), "{:?}", child.events());
    let (at, deadline) = child.extends()[0];
    assert!(at >= secs(6.0));
    // Anchored at the send time of the successful request, which is at or before its answer.
    assert!(deadline <= at + safe());
}

/// A clock that can jump ahead, as a SIGSTOPped wrapper sees it when it resumes.
struct JumpClock {
    base: TokioClock,
    jumped: Mutex<Duration>,
}

impl Clock for JumpClock {
    fn now(&self) -> Duration {
        self.base.now() + *self.jumped.lock().unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answered_after_the_stop_time_is_not_used() {
    let clock = Arc::new(JumpClock { base: TokioClock::new(), jumped: Mutex::new(Duration::ZERO) });
    let mut s = setup();
    s.clock = clock.clone();
    s.store = Arc::new(MemoryStore::new(s.clock.clone()));
    // The renewal sent at 2 s is answered at 2.3 s; meanwhile (at 2.26 s, between two of
    // the elector's clock checks) the wrapper is "frozen" for 7 s, so the answer arrives
    // at 9.3 s, past the stop time (8.7 s).
    s.store.set_renew(Behaviour::Late(secs(0.3)));
    tokio::spawn(async move {
        tokio::time::sleep(secs(2.26)).await;
        *clock.jumped.lock().unwrap() = secs(7.0);
    });
    let mut child = s.recorder(None, false);
    let run = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child);
    let outcome = tokio::time::timeout(secs(60.0), run).await.expect("the child was never stopped");
    assert!(matches!(outcome, Outcome::LeaseLost { .. }), "{outcome:?}");
    assert!(child.extends().is_empty(), "a renewal confirmed after the stop time moved the deadline");
    assert_eq!(child.signals(), vec![(secs(9.3), Signal::SIGTERM)]);
    // SIGKILL at the deadline: 9.8 s - margin.
    assert_eq!(child.kills(), vec![safe()]);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_the_child_at_once() {
    let mut s = setup();
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3.0)).await;
        store.steal(LOCK, "thief", secs(10.0));
    });
    let mut child = s.recorder(None, false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    match &outcome {
        Outcome::LeaseLost { why, .. } => assert!(why.contains("thief"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Stolen at 3 s, seen by the renewal sent at 4 s: stop at 4 s, SIGKILL one grace later.
    assert_eq!(child.signals(), vec![(secs(4.0), Signal::SIGTERM)]);
    assert_eq!(child.kills(), vec![secs(5.0)]);
    // The thief's lease was left alone.
    assert!(s.store.status(LOCK).await.unwrap().holder.as_deref() == Some("thief"));
}

#[tokio::test(start_paused = true)]
async fn a_revoked_lease_is_seen_at_the_next_renewal_and_freed_once_the_child_is_gone() {
    let mut s = setup();
    let store = s.store.clone();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        tokio::time::sleep(secs(2.5)).await;
        store.revoke(LOCK).await.unwrap();
        // Revoked but not yet stood down: nobody else may take it.
        let other = store.acquire(LOCK, "b", secs(10.0)).await.unwrap();
        seen_tx.send(other).unwrap();
    });
    let mut child = s.recorder(None, false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    match &outcome {
        Outcome::LeaseLost { why, .. } => assert!(why.contains("leaderrun release"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(seen_rx.await.unwrap(), Acquire::Held(_)), "a revoked lease was handed to another holder");
    // Seen at the renewal sent at 4 s; a child deaf to the stop signal is killed one grace later.
    assert_eq!(child.signals(), vec![(secs(4.0), Signal::SIGTERM)]);
    assert_eq!(child.kills(), vec![secs(5.0)]);
    // Once the child is gone the holder frees the lock.
    assert_eq!(s.store.expiry(LOCK), None);
}

#[tokio::test(start_paused = true)]
async fn sigterm_is_relayed_then_escalated_and_the_lease_freed_at_once() {
    let mut s = setup();
    let signals = s.signals.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3.0)).await;
        signals.send(Signal::SIGTERM).unwrap();
    });
    let mut child = s.recorder(None, false);
    let outcome = s.elector("a", once(), secs(60.0)).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Signal(9))), "{outcome:?}");
    assert_eq!(child.signals(), vec![(secs(3.0), Signal::SIGTERM)]);
    assert_eq!(child.kills(), vec![secs(4.0)]);
    // Interrupted: free at once, despite the one-shot min-hold.
    assert_eq!(s.store.expiry(LOCK), None);
}

#[tokio::test(start_paused = true)]
async fn other_signals_are_relayed_without_ending_the_run() {
    let mut s = setup();
    let signals = s.signals.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1.0)).await;
        signals.send(Signal::SIGHUP).unwrap();
        signals.send(Signal::SIGUSR1).unwrap();
    });
    let mut child = s.recorder(Some(secs(3.0)), false);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(child.signals(), vec![(secs(1.0), Signal::SIGHUP), (secs(1.0), Signal::SIGUSR1)]);
    assert!(child.kills().is_empty());
}

#[tokio::test(start_paused = true)]
async fn waiting_ends_on_release_and_the_token_grows() {
    let mut s = setup();
    s.store.steal(LOCK, "other", secs(10.0));
    let token_before = s.store.status(LOCK).await.unwrap().token;
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(2.0)).await;
        store.free(LOCK);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(_)), "{outcome:?}");
    match child.events()[0] {
        // Woken by the release notification at 2 s, not by a poll.
        Event::Start { at, token, .. } => {
            assert_eq!(at, secs(2.0));
            assert!(token > token_before);
        }
        ref other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn waiting_takes_over_an_expired_lease() {
    let mut s = setup();
    s.store.steal(LOCK, "crashed", secs(10.0));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(_)), "{outcome:?}");
    match child.events()[0] {
        Event::Start { at, .. } => assert!(at >= secs(10.0) && at <= secs(11.0), "{at:?}"),
        ref other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn wait_timeout_gives_a_conflict() {
    let mut s = setup();
    s.store.steal(LOCK, "other", secs(100.0));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let started = s.clock.now();
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(5.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
    assert_eq!(s.clock.now() - started, secs(5.0));
    assert!(child.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_times_out_on_a_dead_store_reports_the_store_not_a_conflict() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(5.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert!(child.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_signal_while_waiting_ends_the_wait_at_once() {
    let mut s = setup();
    s.store.steal(LOCK, "other", secs(100.0));
    let signals = s.signals.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3.0)).await;
        signals.send(Signal::SIGINT).unwrap();
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Interrupted(Signal::SIGINT)), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(3.0));
    assert!(child.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn waiting_rides_out_store_errors() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(4.0)).await;
        store.set_acquire(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(_)), "{outcome:?}");
    match child.events()[0] {
        Event::Start { at, .. } => {
            assert!(at >= secs(4.0) && at <= secs(4.0) + timing(Duration::ZERO).renew_every, "{at:?}")
        }
        ref other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_acquire_that_times_out_runs_nothing() {
    let mut s = setup();
    // Answered long after the request timeout: the outcome is unknown, so nothing runs.
    s.store.set_acquire(Behaviour::Late(secs(9.5)));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert_eq!(s.clock.now(), timing(Duration::ZERO).request_timeout());
    assert!(child.events().is_empty());
    // The store granted it all the same: the run gave that ghost lease back.
    assert_eq!(s.store.expiry(LOCK), None, "a ghost lease was left for a whole ttl");
}

#[tokio::test(start_paused = true)]
async fn an_acquire_granted_but_answered_with_an_error_is_given_back() {
    let mut s = setup();
    // The store's own timeout (or a reset) fires after it granted the lease: the run sees only
    // an error, which says nothing of whether the write landed.
    s.store.set_acquire(Behaviour::DoneThenFail);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert!(child.events().is_empty());
    // Every other host's run of this firing must find the lock free, not held by a ghost.
    assert_eq!(s.store.expiry(LOCK), None, "the granted lease was left for a whole ttl");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_acquire_errs_after_the_grant_gives_it_back_before_retrying() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::DoneThenFail);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(0.05)).await;
        store.set_acquire(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(60.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let calls: Vec<String> = s.store.calls.lock().unwrap().iter().map(|(_, c)| c.clone()).collect();
    // Given back (a release of token 1) before the next acquire, which then took token 2: not
    // found held under its own identity by that acquire first.
    assert_eq!(calls, ["acquire a", "release 1 keep 0ns", "acquire a", "release 2 keep 0ns"], "{calls:?}");
    assert!(child.events().iter().any(|e| matches!(e, Event::Start { token: 2, .. })), "{:?}", child.events());
}

#[tokio::test(start_paused = true)]
async fn a_ghost_lease_under_a_chosen_identity_is_left_to_expire() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Late(secs(9.5)));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("chosen-by-user", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    // Another run may share a chosen identity: its lease must never be freed by this one.
    assert!(s.store.expiry(LOCK).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_finds_its_own_ghost_gives_it_back_and_runs() {
    let mut s = setup();
    // The first acquire is granted but its answer never comes in time; later ones answer.
    s.store.set_acquire(Behaviour::Late(secs(3.0)));
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1.0)).await;
        store.set_acquire(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(60.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    // It ran long before the ghost's ttl (10 s) would have run out.
    let started = child.events().iter().find_map(|e| match e {
        Event::Start { at, .. } => Some(*at),
        _ => None,
    });
    assert!(started.is_some_and(|at| at < secs(5.0)), "{:?}", child.events());
}

#[tokio::test(start_paused = true)]
async fn the_wait_ends_at_its_deadline_however_late_the_campaign_starts() {
    let mut s = setup();
    s.store.steal(LOCK, "other", secs(3600.0));
    // Opening the store took 4 s of a 5 s --timeout: the campaign has 1 s left, not 5.
    tokio::time::sleep(secs(4.0)).await;
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(5.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(5.0));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_hangs_leaves_time_for_a_second_attempt() {
    let mut s = setup();
    // ttl 10 s, renew every 3 s, kill after 3 s: the stop signal is due 6.6 s after the acquire.
    // Timed out only at the next renewal (3 s), a hung first renewal would leave no room.
    let timing = timing_of(secs(10.0), secs(3.0), secs(3.0), Duration::ZERO);
    s.store.set_renew(Behaviour::Hang);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3.5)).await; // the first renewal (at 3 s) is hanging by now
        store.set_renew(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(12.0)), true);
    let outcome = s.elector_with("a", Mode::Wait { until: None }, timing).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert!(child.signals().is_empty(), "stopped: {:?}", child.events());
}

#[tokio::test(start_paused = true)]
async fn a_slow_renewal_still_counts_while_a_second_one_is_tried() {
    let mut s = setup();
    // ttl 10 s, renew every 3 s, kill after 3 s: the stop signal is due 6.6 s after the acquire,
    // and a second request goes out 1.85 s after the first. Every answer takes 2.5 s: timed out
    // and retried, no renewal would ever answer in time; left in flight, the first does.
    let timing = timing_of(secs(10.0), secs(3.0), secs(3.0), Duration::ZERO);
    s.store.set_renew(Behaviour::Late(secs(2.5)));
    let mut child = s.recorder(Some(secs(12.0)), true);
    let outcome = s.elector_with("a", Mode::Wait { until: None }, timing).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert!(child.signals().is_empty(), "stopped: {:?}", child.events());
    // Each renewal's deadline is anchored at its own send time.
    let first = child.extends()[0];
    assert_eq!(first, (secs(5.5), secs(3.0) + timing.safe_lease()));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_reads_a_held_lease_again_when_it_would_expire_not_every_second() {
    // The memory store announces releases but not expiry (as PostgreSQL's NOTIFY): the
    // waiter re-reads when the lease it saw would lapse, and only then.
    let mut s = setup();
    s.store.steal(LOCK, "crashed", secs(10.0));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(_)), "{outcome:?}");
    let acquires: Vec<Duration> = s
        .store
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, what)| what.starts_with("acquire"))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(acquires.len(), 2, "one read at the start, one at the expiry: {acquires:?}");
    assert!(acquires[1] >= secs(10.0) && acquires[1] <= secs(10.1), "{acquires:?}");
}
