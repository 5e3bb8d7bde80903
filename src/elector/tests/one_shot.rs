//! One-shot runs: the lease kept for --min-hold after the child, a held lock that ends the
//! run, and a store that fails for a moment (a cluster electing a leader), tried again until
//! the run's retry bound; on the paused clock.

use super::*;

#[tokio::test(start_paused = true)]
async fn one_shot_runs_then_keeps_the_lease_for_min_hold() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(3.0)), true);
    let outcome = s.elector("a", once(), secs(60.0)).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(child.events()[0], Event::Start { at: Duration::ZERO, token: 1, deadline: safe() });
    // The lease stays taken until acquisition + min-hold, then lapses by itself.
    assert_eq!(s.store.expiry(LOCK), Some(secs(60.0)));
}

#[tokio::test(start_paused = true)]
async fn one_shot_conflict_runs_nothing() {
    let mut s = setup();
    s.store.steal(LOCK, "other", secs(10.0));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    match outcome {
        Outcome::Conflict(Some(record)) => assert_eq!(record.holder.as_deref(), Some("other")),
        other => panic!("{other:?}"),
    }
    assert!(child.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn one_shot_store_failure_is_reported_before_anything_runs() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert!(child.events().is_empty());
}

/// A store that fails for a while (a cluster electing a new leader): a one-shot run tries
/// again until its retry bound and runs its child once the store answers.
#[tokio::test(start_paused = true)]
async fn one_shot_rides_out_a_store_that_fails_for_a_while() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(2.2)).await;
        store.set_acquire(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    // Tried at 0, then every retry interval (0.5 s with these timings), not backing off.
    let started = child.started.expect("the child ran");
    assert_eq!(started, secs(2.5));
    let acquires = s.store.calls.lock().unwrap().iter().filter(|(_, op)| op.starts_with("acquire")).count();
    assert_eq!(acquires, 6, "tries at 0, 0.5, 1, 1.5, 2 and 2.5 s");
}

/// A store that stays down: the one-shot run gives up at its retry bound, nothing ran.
#[tokio::test(start_paused = true)]
async fn one_shot_gives_up_on_a_store_still_down_at_its_retry_bound() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(5.0), "gives up at the bound, not before nor after");
    assert!(child.events().is_empty());
}

/// A refusal (bad credentials, missing permission) is not retried: it will not pass.
#[tokio::test(start_paused = true)]
async fn one_shot_does_not_retry_a_refusal() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Refuse);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(ref e) if !e.is_transient()), "{outcome:?}");
    assert_eq!(s.clock.now(), Duration::ZERO);
}

/// A one-shot run that meets a held lock after a failed try still ends at once: the retry
/// is for a failing store, not a wait for the lock.
#[tokio::test(start_paused = true)]
async fn one_shot_retry_ends_at_a_held_lock() {
    let mut s = setup();
    s.store.set_acquire(Behaviour::Fail);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(0.7)).await;
        store.set_acquire(Behaviour::Normal);
        store.steal(LOCK, "other", secs(10.0));
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(Some(_))), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(1.0));
    assert!(child.events().is_empty());
}

/// A host frozen between the grant and the child's exec for longer than the lease: the child
/// does not run (`StartError::TooLate`), the lease is given back at once, and the run
/// campaigns again while its retry bound allows; the child then runs under a new token.
#[tokio::test(start_paused = true)]
async fn a_start_too_late_gives_the_lease_back_and_campaigns_again() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(1.0)), true);
    child.too_late = 1;
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, secs(60.0)).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let calls: Vec<String> = s.store.calls.lock().unwrap().iter().map(|(_, op)| op.clone()).collect();
    let first_release = calls.iter().position(|op| op.starts_with("release")).expect("the lease was given back");
    assert!(calls[..first_release].iter().filter(|op| op.starts_with("acquire")).count() == 1, "{calls:?}");
    assert!(calls[first_release..].iter().any(|op| op.starts_with("acquire")), "campaigned again: {calls:?}");
    assert_eq!(child.first_token(), 2, "the child runs under the second lease");
}

/// Past its retry bound, a start too late ends the run as a store failure (exit 69), with
/// nothing run and the lease given back.
#[tokio::test(start_paused = true)]
async fn a_start_too_late_past_the_retry_bound_ends_the_run() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(1.0)), true);
    child.too_late = usize::MAX;
    let outcome = s.elector("a", once(), secs(60.0)).run(&mut child).await;
    match outcome {
        Outcome::StoreFailed(err) => assert!(err.to_string().contains("before the child could start"), "{err}"),
        other => panic!("{other:?}"),
    }
    assert!(child.events().is_empty());
    assert_eq!(s.store.expiry(LOCK), None, "the lease was given back, not kept for --min-hold");
}

/// A lease of this run's own found by its acquire (an earlier attempt was granted after all)
/// whose give-back does not reach the store (a cluster electing a leader): it is tried again
/// within the retry bound, not taken for another holder's, which would end the firing.
#[tokio::test(start_paused = true)]
async fn a_ghost_whose_give_back_fails_is_given_back_again_and_the_run_goes_on() {
    let mut s = setup();
    s.store.steal(LOCK, "a", secs(35.0));
    // The give-back reads the lock first; that read goes unanswered for a while.
    s.store.set_status(Behaviour::Hang);
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1.5)).await;
        store.set_status(Behaviour::Normal);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let mode = Mode::OneShot { until: None, retry_until: secs(5.0) };
    let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "the firing ran: {outcome:?}");
    assert_eq!(child.first_token(), 2, "after the ghost (token 1) was given back");
}
