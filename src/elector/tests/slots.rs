//! --slots on the paused clock: the lowest free slot in a one-shot run, the first slot that
//! frees in a waiting one, and no slot kept that the run does not use.

use super::*;
use crate::slots::record_name;

fn slot(i: usize) -> String {
    record_name(LOCK, i)
}

fn with_slots(s: &mut Setup, identity: &str, mode: Mode, slots: usize) -> Elector {
    let mut elector = s.elector(identity, mode, Duration::ZERO);
    elector.election.slots = slots;
    elector
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_takes_the_lowest_free_slot() {
    let mut s = setup();
    s.store.steal(&slot(0), "x", secs(100.0));
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = with_slots(&mut s, "a", once(), 3).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(child.slot, Some(1));
    assert!(matches!(child.events()[0], Event::Start { token: 1, .. }), "slot 1's first token: {:?}", child.events());
    assert_eq!(s.store.expiry(&slot(1)), None, "released");
    assert!(s.store.expiry(&slot(0)).is_some(), "slot 0's holder untouched");
    assert_eq!(s.store.expiry(&slot(2)), None, "never asked for");
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_finds_every_slot_held_and_does_not_run() {
    let mut s = setup();
    for i in 0..3 {
        s.store.steal(&slot(i), &format!("holder-{i}"), secs(100.0));
    }
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = with_slots(&mut s, "a", once(), 3).run(&mut child).await;
    let Outcome::Conflict(Some(record)) = outcome else { panic!("{outcome:?}") };
    assert_eq!(record.holder.as_deref(), Some("holder-2"), "the last slot's holder");
    assert_eq!(record.lock, LOCK, "records are named by the lock, not by the slot's record");
    assert!(child.started.is_none());
    assert!(s.store.expiry(&slot(3)).is_none(), "a fourth slot is never taken");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_run_takes_the_first_slot_that_frees_and_only_that_one() {
    let mut s = setup();
    s.store.steal(&slot(0), "x", secs(100.0));
    s.store.steal(&slot(1), "y", secs(100.0));
    let store = s.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(5.0)).await;
        store.free(&slot(1));
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = with_slots(&mut s, "a", Mode::Wait { until: None }, 2).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!((child.slot, child.started), (Some(1), Some(secs(5.0))), "woken by the release itself");
    assert!(s.store.expiry(&slot(0)).is_some(), "the other slot's holder is left alone");
}

#[tokio::test(start_paused = true)]
async fn a_slot_granted_to_an_acquire_still_on_its_way_is_given_back() {
    let mut s = setup();
    // Every acquire is granted at once and answered a second later: both slots' acquires
    // are granted, and the campaign that answers second is dropped before its answer is read.
    s.store.set_acquire(Behaviour::Late(secs(1.0)));
    let mut child = s.recorder(Some(secs(30.0)), true);
    let elector = with_slots(&mut s, "a", Mode::Wait { until: None }, 2);
    let run = tokio::spawn(async move { (elector.run(&mut child).await, child.slot) });
    tokio::time::sleep(secs(10.0)).await;
    let held: Vec<usize> = (0..2).filter(|&i| s.store.expiry(&slot(i)).is_some()).collect();
    assert_eq!(held.len(), 1, "one slot runs the child, the other is free again: {held:?}");
    let (outcome, started_in) = run.await.unwrap();
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(started_in, Some(held[0]));
}

#[tokio::test(start_paused = true)]
async fn a_signal_ends_every_slots_wait() {
    let mut s = setup();
    s.store.steal(&slot(0), "x", secs(100.0));
    s.store.steal(&slot(1), "y", secs(100.0));
    let signals = s.signals.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3.0)).await;
        signals.send(Signal::SIGTERM).unwrap();
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = with_slots(&mut s, "a", Mode::Wait { until: None }, 2).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Interrupted(Signal::SIGTERM)), "{outcome:?}");
    assert!(child.started.is_none());
}

/// A start too late under --slots campaigns again as a plain lock's does: the slot is given
/// back and the run takes a slot anew (the lowest free one), under a new token.
#[tokio::test(start_paused = true)]
async fn a_start_too_late_under_slots_campaigns_again() {
    for mode in [Mode::OneShot { until: None, retry_until: secs(5.0) }, Mode::Wait { until: None }] {
        let mut s = setup();
        s.store.steal(&slot(0), "x", secs(100.0));
        let mut child = s.recorder(Some(secs(1.0)), true);
        child.too_late = 1;
        let outcome = with_slots(&mut s, "a", mode, 3).run(&mut child).await;
        assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{mode:?}: {outcome:?}");
        let calls: Vec<String> = s.store.calls.lock().unwrap().iter().map(|(_, op)| op.clone()).collect();
        assert!(calls.iter().any(|op| op.starts_with("release 1")), "{mode:?}: the slot was given back: {calls:?}");
        assert_eq!(child.slot, Some(1), "{mode:?}: the lowest free slot, taken anew");
        assert_eq!(child.first_token(), 2, "{mode:?}: under the slot's second lease");
        assert!(s.store.expiry(&slot(0)).is_some(), "{mode:?}: slot 0's holder untouched");
    }
}

/// A slot's acquire granted but answered with an error: its campaign gives it back, and is
/// dropped while it does (another slot won meanwhile). The give-back is still made.
#[tokio::test(start_paused = true)]
async fn a_slot_whose_campaign_is_dropped_while_giving_it_back_is_given_back() {
    let mut s = setup();
    s.store.set_acquire_for(&slot(0), Behaviour::Late(secs(0.2)));
    s.store.set_acquire_for(&slot(1), Behaviour::DoneThenFail);
    // A give-back reads the lock first: that read takes half a second.
    s.store.set_status(Behaviour::Late(secs(0.5)));
    let mut child = s.recorder(Some(secs(30.0)), true);
    let elector = with_slots(&mut s, "a", Mode::Wait { until: None }, 2);
    let run = tokio::spawn(async move { (elector.run(&mut child).await, child.slot) });
    tokio::time::sleep(secs(5.0)).await;
    assert!(s.store.expiry(&slot(0)).is_some(), "slot 0 runs the child");
    assert_eq!(s.store.expiry(&slot(1)), None, "slot 1 was given back");
    let (outcome, started_in) = run.await.unwrap();
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(started_in, Some(0));
}

/// The give-back of a slot granted to a dropped campaign goes on beside the child; a child
/// that ends first does not end it: the run waits for it before it ends.
#[tokio::test(start_paused = true)]
async fn a_short_child_does_not_cut_a_slots_give_back_short() {
    let mut s = setup();
    // Both slots' acquires are granted at once and answered a second later.
    s.store.set_acquire(Behaviour::Late(secs(1.0)));
    s.store.set_status(Behaviour::Late(secs(0.5)));
    let mut child = s.recorder(Some(secs(0.1)), true);
    let outcome = with_slots(&mut s, "a", Mode::Wait { until: None }, 2).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let held: Vec<usize> = (0..2).filter(|&i| s.store.expiry(&slot(i)).is_some()).collect();
    assert!(held.is_empty(), "when the run ends, no slot is left held: {held:?}");
}

/// A slot's acquire still on its way when its campaign is dropped (another slot won) lands
/// after the first give-back: the give-back made once more, when that acquire's answer would
/// have been too late to count, frees it.
#[tokio::test(start_paused = true)]
async fn a_slot_acquire_that_lands_after_its_give_back_is_given_back_too() {
    let mut s = setup();
    // Slot 0 is granted at once and answered a moment later, after slot 1's acquire went out.
    s.store.set_acquire_for(&slot(0), Behaviour::Late(secs(0.1)));
    s.store.set_acquire_for(&slot(1), Behaviour::LandsAfter(secs(0.5)));
    let mut child = s.recorder(Some(secs(30.0)), true);
    let elector = with_slots(&mut s, "a", Mode::Wait { until: None }, 2);
    let run = tokio::spawn(async move { (elector.run(&mut child).await, child.slot) });
    tokio::time::sleep(secs(5.0)).await;
    assert!(s.store.expiry(&slot(0)).is_some(), "slot 0 runs the child");
    assert_eq!(s.store.expiry(&slot(1)), None, "slot 1's late acquire was given back");
    let (outcome, started_in) = run.await.unwrap();
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(started_in, Some(0));
}
