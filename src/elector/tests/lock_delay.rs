//! --lock-delay on the paused clock: the store is asked for leases of ttl + delay, while the
//! child is stopped and killed exactly when the ttl alone says; a holder lost uncleanly keeps
//! the lock closed for the delay after its lease, and a release opens it at once.

use super::*;

const DELAY: f64 = 30.0;

/// The house timings of these tests (ttl 10 s, renew 2 s, kill after 1 s) with a delay.
fn delayed(min_hold: Duration) -> Timing {
    Timing { lock_delay: secs(DELAY), ..timing(min_hold) }
}

#[tokio::test(start_paused = true)]
async fn every_acquire_and_renewal_asks_for_the_ttl_and_the_delay() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(7.0)), true);
    let outcome = s.elector_with("a", Mode::Wait { until: None }, delayed(Duration::ZERO)).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let ttls = s.store.ttls.lock().unwrap().clone();
    let lease = secs(10.0 + DELAY);
    assert_eq!(
        ttls,
        [
            (secs(0.0), "acquire", lease),
            (secs(2.0), "renew", lease),
            (secs(4.0), "renew", lease),
            (secs(6.0), "renew", lease)
        ]
    );
    // The deadlines the renewals earned are those of the ttl alone.
    assert_eq!(child.extends(), [2.0, 4.0, 6.0].map(|at| (secs(at), secs(at) + safe())));
}

#[tokio::test(start_paused = true)]
async fn the_stop_signal_and_sigkill_come_when_the_ttl_alone_says() {
    let mut times = Vec::new();
    for timing in [timing(Duration::ZERO), delayed(Duration::ZERO)] {
        let mut s = setup();
        s.store.set_renew(Behaviour::Fail);
        // A child that ignores the stop signal: only SIGKILL ends it.
        let mut child = s.recorder(None, false);
        let outcome = s.elector_with("a", Mode::Wait { until: None }, timing).run(&mut child).await;
        assert!(matches!(outcome, Outcome::LeaseLost { exit: ChildExit::Signal(9), .. }), "{outcome:?}");
        times.push((child.signals(), child.kills()));
    }
    assert_eq!(times[0], (vec![(safe() - secs(1.0), Signal::SIGTERM)], vec![safe()]), "without a delay");
    assert_eq!(times[1], times[0], "the delay moves neither the stop signal nor SIGKILL");
}

#[tokio::test(start_paused = true)]
async fn a_holder_lost_uncleanly_keeps_the_lock_closed_for_the_delay_after_its_stop_time() {
    let mut s = setup();
    let mut holder = s.recorder(None, true);
    // The holder's wrapper is killed at 5 s (its future dropped: no release), after its
    // renewal sent at 4 s succeeded.
    let killed = tokio::time::timeout(
        secs(5.0),
        s.elector_with("a", Mode::Wait { until: None }, delayed(Duration::ZERO)).run(&mut holder),
    )
    .await;
    assert!(killed.is_err(), "still leading at 5 s");
    let (last_renewal, holder_deadline) = *holder.extends().last().expect("renewed");
    assert_eq!((last_renewal, holder_deadline), (secs(4.0), secs(4.0) + safe()));
    let holder_stop = delayed(Duration::ZERO).stop_at(holder_deadline);

    let mut standby = s.recorder(Some(secs(1.0)), true);
    let outcome = s.elector_with("b", Mode::Wait { until: None }, delayed(Duration::ZERO)).run(&mut standby).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    let started = standby
        .events()
        .into_iter()
        .find_map(|e| if let Event::Start { at, .. } = e { Some(at) } else { None })
        .expect("the standby ran");
    // The store kept the lease for ttl + delay from the renewal's send: the standby came in
    // no sooner, which is at least the delay after the holder's stop signal and its SIGKILL.
    assert!(started >= last_renewal + secs(10.0 + DELAY), "{started:?}");
    assert!(started >= holder_stop + secs(DELAY) && started >= holder_deadline + secs(DELAY), "{started:?}");
}

#[tokio::test(start_paused = true)]
async fn a_release_opens_the_lock_at_once_and_a_keep_when_it_ends() {
    let mut s = setup();
    let mut child = s.recorder(Some(secs(3.0)), true);
    let outcome = s.elector_with("a", Mode::Wait { until: None }, delayed(Duration::ZERO)).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(s.store.expiry(LOCK), None, "a clean exit frees the lock at once, delay or not");

    // A one-shot run's --min-hold keep ends when the keep says, not a delay later.
    let mut s = setup();
    let mut child = s.recorder(Some(secs(3.0)), true);
    let outcome = s.elector_with("a", once(), delayed(secs(8.0))).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    assert_eq!(s.store.expiry(LOCK), Some(secs(8.0)), "kept until acquisition + --min-hold");
}
