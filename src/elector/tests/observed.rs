//! What the run's observers hear (the lease file, the leader file, systemd, --http), on the
//! paused clock: the order of a term's events, a published stop time never later than the
//! child's stop signal, and a standby that asks the store at least every heartbeat.

use super::*;
use crate::observe::{self, Observer};

/// Each event as a word, with the clock reading; the stop times published.
#[derive(Default)]
pub(super) struct Heard {
    clock: Option<Arc<dyn Clock>>,
    words: Mutex<Vec<(Duration, String)>>,
}

impl Heard {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self { clock: Some(clock), words: Mutex::default() })
    }

    pub(super) fn words(&self) -> Vec<String> {
        self.words.lock().unwrap().iter().map(|(_, w)| w.clone()).collect()
    }

    pub(super) fn at(&self, word: &str) -> Vec<Duration> {
        self.words.lock().unwrap().iter().filter(|(_, w)| w == word).map(|(at, _)| *at).collect()
    }
}

impl Observer for Heard {
    fn event(&self, event: &observe::Event<'_>) {
        use observe::Event as E;
        let word = match event {
            E::Campaigning { .. } => "campaigning".to_string(),
            E::Attempted(attempt) => format!("acquire {}", attempt.label()),
            E::Elected { stop_at, .. } => format!("elected, stop at {:.1}", stop_at.as_secs_f64()),
            E::ChildStarted => "child started".into(),
            E::Renewal(observe::Renewal::Renewed { stop_at }) => {
                format!("renewed, stop at {:.1}", stop_at.as_secs_f64())
            }
            E::Renewal(other) => format!("renewal {}", other.label()),
            E::SteppingDown => "stepping down".into(),
            E::ChildEnded { why, .. } => format!("child ended: {}", why.label()),
            E::Released => "released".into(),
            E::Stopping => "stopping".into(),
            E::StoreCall { .. } => return,
        };
        let at = self.clock.as_ref().unwrap().now();
        self.words.lock().unwrap().push((at, word));
    }
}

#[tokio::test(start_paused = true)]
async fn a_term_is_heard_in_order_with_the_stop_times_the_child_keeps() {
    let mut s = setup();
    let heard = Heard::new(s.clock.clone());
    let mut child = s.recorder(Some(secs(5.0)), true);
    let elector = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).observed_by(heard.clone());
    let outcome = elector.run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    // The stop time is the deadline less --kill-after (1 s): 9.7 s after each send.
    let stop = |sent: f64| format!("{:.1}", (secs(sent) + safe() - secs(1.0)).as_secs_f64());
    assert_eq!(
        heard.words(),
        [
            "campaigning".to_string(),
            "acquire won".into(),
            format!("elected, stop at {}", stop(0.0)),
            "child started".into(),
            format!("renewed, stop at {}", stop(2.0)),
            format!("renewed, stop at {}", stop(4.0)),
            "child ended: exited".into(),
            "released".into(),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_cannot_be_renewed_steps_down_no_later_than_the_stop_signal() {
    let mut s = setup();
    s.store.set_renew(Behaviour::Fail);
    let heard = Heard::new(s.clock.clone());
    let mut child = s.recorder(None, true);
    let elector = s.elector("a", Mode::Wait { until: None }, Duration::ZERO).observed_by(heard.clone());
    let outcome = elector.run(&mut child).await;
    assert!(matches!(outcome, Outcome::LeaseLost { .. }), "{outcome:?}");
    let signalled = child.signals()[0].0;
    assert_eq!(heard.at("stepping down"), [signalled], "heard when the stop signal went");
    let words = heard.words();
    assert!(!words.iter().any(|w| w.starts_with("renewed")), "{words:?}");
    assert!(words.contains(&"renewal failed".to_string()), "{words:?}");
    let tail: Vec<&str> = words.iter().rev().take(3).rev().map(String::as_str).collect();
    assert_eq!(tail, ["stepping down", "child ended: lease_expired", "released"]);
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_bounds_how_long_an_idle_standby_goes_without_asking() {
    let mut s = setup();
    // Held by another whose lease outlasts the test: without a heartbeat the standby would
    // next read when that lease expires.
    s.store.steal(LOCK, "other", secs(300.0));
    let heard = Heard::new(s.clock.clone());
    let mut elector = s.elector("a", Mode::Wait { until: Some(secs(20.0)) }, Duration::ZERO);
    elector.election.heartbeat = Some(secs(3.0));
    let mut child = s.recorder(None, true);
    let outcome = elector.observed_by(heard.clone()).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(_)), "{outcome:?}");
    let checks = heard.at("acquire held");
    assert!(checks.len() >= 7, "a check at least every 3 s for 20 s: {checks:?}");
    assert!(checks.windows(2).all(|w| w[1] - w[0] <= secs(3.0)), "{checks:?}");
}
