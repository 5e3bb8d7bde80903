//! A won write that must be confirmed (a Choria bucket's cool-down), on the paused clock:
//! the child starts only once a renewal after the cool-down succeeds, and a lease lost,
//! revoked, failed, interrupted or timed out meanwhile is given back.

use super::*;

/// The first Start event, if the child started.
fn start_of(child: &Recorder) -> Option<(Duration, u64, Duration)> {
    child.events().into_iter().find_map(|e| match e {
        Event::Start { at, token, deadline } => Some((at, token, deadline)),
        _ => None,
    })
}

#[tokio::test(start_paused = true)]
async fn a_write_that_needs_confirming_starts_the_child_only_after_the_cool_down() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    // The confirming renewal is applied at once but answered 0.5 s later.
    s.store.set_renew(Behaviour::Late(secs(0.5)));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let calls: Vec<String> = s.store.calls.lock().unwrap().iter().map(|(at, op)| format!("{at:?} {op}")).collect();
    assert_eq!(&calls[..2], ["0ns acquire a", "3s renew 1"], "confirmed by a renewal after the cool-down");
    // Started once confirmed, with the deadline anchored at the confirming renewal's send time.
    assert_eq!(start_of(&child), Some((secs(3.5), 1, secs(3.0) + safe())));
}

#[tokio::test(start_paused = true)]
async fn a_confirmation_that_finds_the_lease_lost_runs_nothing() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1.0)).await;
        store.steal(LOCK, "evictor", secs(100.0));
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    match outcome {
        Outcome::Conflict(Some(record)) => assert_eq!(record.holder.as_deref(), Some("evictor")),
        other => panic!("a lost campaign is a conflict, not a run: {other:?}"),
    }
    assert!(child.events().is_empty(), "{:?}", child.events());
    assert_eq!(s.store.status(LOCK).await.unwrap().holder.as_deref(), Some("evictor"), "left alone");
}

/// `leaderrun release` during the cool-down revokes the entry this run wrote: the run must
/// free it, or it would keep the lock for the store's whole lifetime of an entry, and no
/// second release could free it (revoking only asks a holder to stand down).
#[tokio::test(start_paused = true)]
async fn a_revoke_during_the_cool_down_gives_the_lease_back() {
    for mode in [once(), Mode::Wait { until: None }] {
        let mut s = setup();
        s.store.set_confirm(Some(secs(3.0)));
        let store = s.store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(secs(1.0)).await;
            store.revoke(LOCK).await.unwrap();
        });
        let mut child = s.recorder(Some(secs(1.0)), true);
        let outcome = s.elector("a", mode, Duration::ZERO).run(&mut child).await;
        assert!(matches!(outcome, Outcome::Conflict(Some(_))), "{mode:?}: stood down: {outcome:?}");
        assert!(child.events().is_empty(), "{mode:?}: {:?}", child.events());
        let status = s.store.status(LOCK).await.unwrap();
        assert!(!status.is_held(), "{mode:?}: the revoked entry was left: {status:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_confirmation_fails_campaigns_on_and_runs_once_confirmed() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    let store = s.store.clone();
    tokio::spawn(async move {
        // Evicted and taken during the first cool-down, by a holder that leaves at 6 s.
        tokio::time::sleep(secs(1.0)).await;
        store.steal(LOCK, "evictor", secs(5.0));
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let (at, token, deadline) = start_of(&child).expect("the child ran");
    // Won again once the evictor's lease lapsed (6 s), confirmed a cool-down later.
    assert!(at >= secs(9.0) && token == 3, "{:?}", child.events());
    assert_eq!(deadline, at + safe());
}

#[tokio::test(start_paused = true)]
async fn a_confirmation_that_fails_gives_the_lease_back() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    s.store.set_renew(Behaviour::Fail);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", once(), Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::StoreFailed(_)), "{outcome:?}");
    assert!(child.events().is_empty());
    assert_eq!(s.store.expiry(LOCK), None, "the unconfirmed lease was given back");
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_the_cool_down_gives_the_lease_back() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    let signals = s.signals.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1.0)).await;
        signals.send(Signal::SIGINT).unwrap();
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Interrupted(Signal::SIGINT)), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(1.0), "at once");
    assert!(child.events().is_empty());
    assert_eq!(s.store.expiry(LOCK), None, "the lease was given back");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_during_the_cool_down_gives_the_lease_back_as_a_conflict() {
    let mut s = setup();
    s.store.set_confirm(Some(secs(3.0)));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector("a", Mode::Wait { until: Some(secs(2.0)) }, Duration::ZERO).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(None)), "{outcome:?}");
    assert_eq!(s.clock.now(), secs(2.0));
    assert!(child.events().is_empty());
    assert_eq!(s.store.expiry(LOCK), None, "the lease was given back");
}
