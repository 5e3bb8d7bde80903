//! When a waiter reads the lock again: the decision alone, on boot-clock times passed in.
//!
//! The head of the queue reads as soon as it hears of a release and just after the lease it
//! last read lapses. A waiter behind the head gives the head one stagger: it reads that long
//! after it heard a release (a write to the sidecar) or after the lapse, whichever comes
//! first, and acts only if the lock is still free then. So a head that is frozen while it
//! holds its byte costs each handoff one stagger, not the rest of a lease; a live head has
//! long taken the lock by then, and the others only read.

use std::time::Duration;

use rand::Rng;

/// The head reads a lapsed lease this long after it lapsed (the record's lapse is judged on
/// the same boot clock, so only rounding needs room).
pub const AT_HEAD: Duration = Duration::from_millis(1);

/// The shortest stagger of a waiter behind the head: longer than the head's own handoff (its
/// wake-up, a read and the acquire, local and a few milliseconds even on a loaded host).
pub const STAGGER_FROM: Duration = Duration::from_millis(20);
/// The longest. Each waiter draws its own between the two, so that when the head does not
/// act, the first to do so is usually alone for a while and the others read it held.
pub const STAGGER_TO: Duration = Duration::from_millis(120);

/// A random stagger for one wait.
pub fn stagger() -> Duration {
    rand::rng().random_range(STAGGER_FROM..STAGGER_TO)
}

/// When to read the lock again: `lapse` is when the lease last read lapses, `heard` when a
/// release was heard since that read, if one was.
pub fn read_at(head: bool, lapse: Duration, heard: Option<Duration>, stagger: Duration) -> Duration {
    if head {
        heard.map_or(lapse + AT_HEAD, |heard| heard.min(lapse + AT_HEAD))
    } else {
        heard.map_or(lapse, |heard| heard.min(lapse)) + stagger
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_millis(80);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_head_reads_at_once_and_at_the_lapse() {
        assert_eq!(read_at(true, ms(5000), None, S), ms(5000) + AT_HEAD);
        assert_eq!(read_at(true, ms(5000), Some(ms(1200)), S), ms(1200));
    }

    #[test]
    fn a_waiter_behind_the_head_gives_it_one_stagger() {
        // Nothing heard: a stagger after the lapse.
        assert_eq!(read_at(false, ms(5000), None, S), ms(5080));
        // A release heard long before the lapse: a stagger after it, not after the lapse.
        assert_eq!(read_at(false, ms(5000), Some(ms(1200)), S), ms(1280));
        // Heard after the lapse (a release of a lease that had lapsed): the lapse counts.
        assert_eq!(read_at(false, ms(5000), Some(ms(5050)), S), ms(5080));
    }

    #[test]
    fn staggers_stay_in_range_and_behind_the_head() {
        for _ in 0..100 {
            let s = stagger();
            assert!((STAGGER_FROM..STAGGER_TO).contains(&s));
            assert!(read_at(false, ms(10), None, s) > read_at(true, ms(10), None, s));
        }
    }
}
