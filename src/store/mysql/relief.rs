//! The relief: one waiter that makes sure the waiter woken first at a release takes its turn.
//!
//! The server hands the holder's user lock to ONE waiter at a release. That waiter may be
//! frozen, and keeps the user lock while it is: the others stay blocked behind it. So the
//! holder keeps a second user lock, named by its fencing token, on which one waiter (the
//! relief, which holds a seat lock of its own so that there is only one) blocks. A release
//! frees both: the first waiter acts at once, and the relief looks (one statement: the
//! record, and who holds the turn's user lock). A new holder: it waits on that holder's
//! second user lock. Free, and nobody holds the turn: it acts. Free, and a waiter holds the
//! turn: it gives that waiter one stagger; still free then, and the same session holding
//! the turn, it ends that session (`KILL CONNECTION`: allowed on one's own user's sessions),
//! so the server hands the turn on to the next waiter, as it does when a waiter dies. A
//! frozen first waiter thus costs a handoff one stagger, and is then out of the queue until
//! it thaws and waits again. Where the kill is refused (another database user), the relief
//! acts itself.
//!
//! This file is the decision alone, on tokio's clock; `hint` does the talking.

use std::time::Duration;

use tokio::time::Instant;

/// How long the relief gives the first waiter, at least: its wake-up, and the acquire (one
/// round trip), are far shorter, even on a loaded host.
pub const STAGGER_FROM: Duration = Duration::from_millis(100);
/// The longest; short beside any lease, since it is what a frozen first waiter costs.
pub const STAGGER_TO: Duration = Duration::from_millis(300);

/// A random stagger for one wait.
pub fn stagger() -> Duration {
    use rand::Rng;
    rand::rng().random_range(STAGGER_FROM..STAGGER_TO)
}

/// What one look showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The lease is held (or kept for --min-hold), under this fencing token.
    Held(u64),
    /// The lease is free; `turn` is the session holding the turn's user lock, if any.
    Free { turn: Option<u64> },
}

/// What the relief does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A new holder: wait on its second user lock.
    Rewait(u64),
    /// The holder it waited on still holds the lease (its session died, or it keeps the lease
    /// for --min-hold): nothing to do until the wait's end.
    Idle,
    /// Look again at this time.
    LookAt(Instant),
    /// End this session: it holds the turn and did not take it in time.
    Bypass(u64),
    /// Take the lease: nobody else will.
    Go,
}

/// The relief's view of one release.
#[derive(Debug)]
pub struct Relief {
    /// The token of the lease it waited on.
    token: u64,
    stagger: Duration,
    /// The session seen holding the turn while the lease was free, and since when.
    suspect: Option<(u64, Instant)>,
}

impl Relief {
    pub fn new(token: u64, stagger: Duration) -> Self {
        Self { token, stagger, suspect: None }
    }

    pub fn step(&mut self, seen: Seen, now: Instant) -> Step {
        match seen {
            Seen::Held(token) if token != self.token => Step::Rewait(token),
            Seen::Held(_) => Step::Idle,
            Seen::Free { turn: None } => Step::Go,
            Seen::Free { turn: Some(session) } => match self.suspect {
                Some((suspect, since)) if suspect == session => {
                    if now >= since + self.stagger {
                        self.suspect = None;
                        Step::Bypass(session)
                    } else {
                        Step::LookAt(since + self.stagger)
                    }
                }
                // A waiter (or another one, the first having let go) was handed the turn.
                _ => {
                    self.suspect = Some((session, now));
                    Step::LookAt(now + self.stagger)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGGER: Duration = Duration::from_millis(200);

    #[tokio::test(start_paused = true)]
    async fn a_first_waiter_that_takes_its_turn_is_left_alone() {
        let mut relief = Relief::new(7, STAGGER);
        let now = Instant::now();
        assert_eq!(relief.step(Seen::Free { turn: Some(42) }, now), Step::LookAt(now + STAGGER));
        tokio::time::advance(STAGGER).await;
        assert_eq!(relief.step(Seen::Held(8), Instant::now()), Step::Rewait(8));
        // Seen at once: the same.
        assert_eq!(Relief::new(7, STAGGER).step(Seen::Held(8), now), Step::Rewait(8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_waiter_that_does_not_act_in_a_stagger_is_bypassed() {
        let mut relief = Relief::new(7, STAGGER);
        let now = Instant::now();
        relief.step(Seen::Free { turn: Some(42) }, now);
        tokio::time::advance(STAGGER / 2).await;
        assert_eq!(relief.step(Seen::Free { turn: Some(42) }, Instant::now()), Step::LookAt(now + STAGGER));
        tokio::time::advance(STAGGER / 2).await;
        assert_eq!(relief.step(Seen::Free { turn: Some(42) }, Instant::now()), Step::Bypass(42));
        // The server hands the turn to the next waiter, which gets a stagger of its own.
        let later = Instant::now();
        assert_eq!(relief.step(Seen::Free { turn: Some(43) }, later), Step::LookAt(later + STAGGER));
        assert_eq!(relief.step(Seen::Held(8), later), Step::Rewait(8));
    }

    #[test]
    fn nobody_at_the_turn_means_the_relief_goes() {
        let now = Instant::now();
        assert_eq!(Relief::new(7, STAGGER).step(Seen::Free { turn: None }, now), Step::Go);
    }

    #[test]
    fn a_lease_still_held_by_the_same_holder_is_waited_out() {
        let now = Instant::now();
        assert_eq!(Relief::new(7, STAGGER).step(Seen::Held(7), now), Step::Idle);
    }

    #[test]
    fn staggers_stay_in_range() {
        for _ in 0..100 {
            assert!((STAGGER_FROM..STAGGER_TO).contains(&stagger()));
        }
    }
}
