//! --max-runtime on the paused clock: the stop signal when the child has run that long,
//! SIGKILL --kill-after later, the lease renewed meanwhile, kept for --min-hold after.

use super::*;

fn with_limit(s: &mut Setup, mode: Mode, min_hold: Duration, limit: f64) -> Elector {
    let mut elector = s.elector("a", mode, min_hold);
    elector.election.max_runtime = Some(secs(limit));
    elector
}

#[tokio::test(start_paused = true)]
async fn a_child_that_runs_too_long_is_stopped_and_the_run_says_so() {
    let mut s = setup();
    let mut child = s.recorder(None, true);
    let outcome = with_limit(&mut s, Mode::Wait { until: None }, Duration::ZERO, 5.0).run(&mut child).await;
    assert!(matches!(outcome, Outcome::RanTooLong(ChildExit::Signal(15))), "{outcome:?}");
    assert_eq!(child.signals(), [(secs(5.0), Signal::SIGTERM)]);
    assert!(child.kills().is_empty());
    assert_eq!(s.store.expiry(LOCK), None, "released at once in --wait mode");
}

#[tokio::test(start_paused = true)]
async fn one_that_ignores_the_stop_signal_is_killed_and_the_lease_is_renewed_meanwhile() {
    let mut s = setup();
    let mut child = s.recorder(None, false);
    // --kill-after is 1 s; renewals every 2 s go on while it winds down.
    let outcome = with_limit(&mut s, once(), secs(60.0), 9.5).run(&mut child).await;
    assert!(matches!(outcome, Outcome::RanTooLong(ChildExit::Signal(9))), "{outcome:?}");
    assert_eq!(child.signals(), [(secs(9.5), Signal::SIGTERM)]);
    assert_eq!(child.kills(), [secs(10.5)]);
    assert!(
        child.extends().iter().any(|(at, _)| *at == secs(10.0)),
        "renewed while winding down: {:?}",
        child.extends()
    );
    assert_eq!(s.store.expiry(LOCK), Some(secs(60.0)), "kept for --min-hold, as after any child");
}

#[tokio::test(start_paused = true)]
async fn a_child_done_in_time_is_not_touched() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(3.0)), true);
    let outcome = with_limit(&mut s, Mode::Wait { until: None }, Duration::ZERO, 5.0).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert!(child.signals().is_empty());
}

#[tokio::test(start_paused = true)]
async fn past_the_stop_time_a_run_stopped_for_running_too_long_treats_its_lease_as_expiring() {
    let mut s = setup();
    // Renewals hang (the store is locked by someone else): the stop time stays at 8.7 s.
    s.store.set_renew(Behaviour::Hang);
    let heard = super::observed::Heard::new(s.clock.clone());
    // It ignores the stop signal sent at 8 s: SIGKILL comes --kill-after (1 s) later, at 9 s,
    // so the stop time passes while it winds down.
    let mut child = s.recorder(None, false);
    let elector = with_limit(&mut s, once(), secs(60.0), 8.0).observed_by(heard.clone());
    let outcome = elector.run(&mut child).await;
    let stop_at = secs(8.7);
    assert!(
        matches!(outcome, Outcome::LeaseLost { exit: ChildExit::Signal(9), .. }),
        "past its stop time the lease could not be trusted: {outcome:?}"
    );
    assert_eq!(heard.at("stepping down"), [stop_at], "the observers hear it step down at the stop time");
    let late: Vec<_> = s
        .store
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, what)| *at >= stop_at && what.starts_with("renew"))
        .cloned()
        .collect();
    assert!(late.is_empty(), "no renewal is sent past the stop time: {} of them, from {:?}", late.len(), late.first());
    assert_eq!(child.signals(), [(secs(8.0), Signal::SIGTERM)], "one stop signal");
    assert_eq!(s.store.expiry(LOCK), None, "no --min-hold keep for an untrusted lease");
}
