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
