//! An object store server's clock (each response's HTTP `Date` header), and the
//! fencing-token floor derived from it: shared by the stores whose objects keep no counter
//! that outlives them (S3, Cloud Storage).
//!
//! Such a store has no number that survives an object: delete the lock's object and its
//! token chain is gone. (Cloud Storage's generations are no help: Google documents only
//! that they are unique, not that they increase.) So tokens follow the server's clock as
//! well as the chain: a lock's token is `max(previous token, floor) + 1`, where the floor
//! is the whole seconds of the read's `Date` times 1,000,000, or the NEXT second's when the
//! object is absent. No realistic acquisition rate outruns a million a second, so the chain
//! restarts from each new second's floor and stays below the next second's.
//!
//! A create (the only write that cannot see the previous token) is where it could break, in
//! two ways, and both are closed:
//! - It lands late. Its token came from its read's second, but the PUT may land seconds
//!   later (a slow network, a paused host, an SDK retry), after another run created, held
//!   and lost an object of its own there (deleted). Every token written before the create
//!   landed is below the next second's floor of the second it landed in (`create_floor`):
//!   the core raises the create's token above that, in one write guarded by the create's
//!   version, before any child runs under it.
//! - Another create lands in the same second after a deletion, with the same floor. So a
//!   token counts only once every later create is told a floor at least as large
//!   (`token_counts`), with the object unchanged: a create's token once the server's clock
//!   has left the second it landed in, and so does any token written above the floor of the
//!   next second, whichever write carried it (a takeover of a record whose create never
//!   counted, its settling read lost, carries one). The core waits for it
//!   (`Records::counts`). The cost: the first acquisition of a lock, and the first after its
//!   object was deleted, wait for the rest of that second (half a second on average, at most
//!   one); an ordinary takeover, nothing.
//!
//! This holds as long as the `Date` the bucket's servers send never goes back by a second (a
//! stepped-back clock, or servers whose clocks straddle a second boundary, could repeat a
//! token after a deletion; while the object lives, the chain alone keeps tokens increasing).
//! A server that sends no `Date` gives floor 0: the chain only. Tokens are about 1.8·10^15
//! today: exact in JSON doubles (below 2^53) until the year 2255.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Tokens per second of the server's clock.
pub const TOKENS_PER_SECOND: u64 = 1_000_000;

/// A create counts once the server's clock is this many seconds past the start of the
/// second it landed in.
pub const CREATE_SETTLES_AFTER: u64 = 1;

/// The floor for a read answered at `date`: every token taken before that read is below it,
/// given the confirmation a create waits for.
pub fn floor(date: Option<SystemTime>, object_exists: bool) -> u64 {
    let Some(seconds) = date.and_then(|d| d.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs()) else {
        return 0;
    };
    let seconds = if object_exists { seconds } else { seconds + 1 };
    seconds.saturating_mul(TOKENS_PER_SECOND)
}

/// At least every token a lease was granted with before a create that the server answered
/// at `written`: those came from reads in that second or earlier, and the floor of a read
/// of an absent object in that second is this. (A create read in that same second carries
/// more, but never counted: it had to outlive the second, and this create found the name
/// empty.) A create whose token is not above it is raised.
pub fn create_floor(written: Option<SystemTime>) -> u64 {
    floor(written, false)
}

/// Whether a lease granted with `token` may count once the server's clock reads `now`: every
/// create that lands from then on is told a floor of at least `token` (`create_floor`). A
/// create's token (from the next second's floor) counts once its second is over; so does a
/// takeover of a record whose token came from a create that never counted (its settling read
/// failed), or it could run above a later create's token. With no server clock, there is no
/// floor to protect.
pub fn token_counts(token: u64, now: Option<SystemTime>) -> bool {
    now.is_none() || create_floor(now) >= token
}

/// Whether the server's clock, read at `now`, has left the second a create landed in
/// (answered at `written`), so that the create may count.
pub fn create_is_settled(written: Option<SystemTime>, now: Option<SystemTime>) -> bool {
    match (written, now) {
        (Some(written), Some(now)) => now >= whole_second(written) + Duration::from_secs(CREATE_SETTLES_AFTER),
        _ => true, // no server clock: no floor to protect
    }
}

fn whole_second(at: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
}

/// An HTTP `Date` in the form every server must send (RFC 9110's IMF-fixdate,
/// `Sun, 06 Nov 1994 08:49:37 GMT`); `None` for anything else (the obsolete forms, which
/// only ancient servers send, then simply give no floor).
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    let mut parts = text.trim().split(' ');
    let (_weekday, day, month, year, time, zone) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || zone != "GMT" || day.len() != 2 || year.len() != 4 {
        return None;
    }
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = MONTHS.iter().position(|m| *m == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let mut hms = time.split(':').map(|p| p.parse::<i64>().ok().filter(|_| p.len() == 2));
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + h * 3_600 + m * 60 + s;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> Option<SystemTime> {
        Some(UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis))
    }

    #[test]
    fn floors_follow_the_servers_seconds() {
        assert_eq!(floor(at(1_700_000_000, 999), true), 1_700_000_000 * TOKENS_PER_SECOND);
        assert_eq!(floor(at(1_700_000_000, 0), false), 1_700_000_001 * TOKENS_PER_SECOND);
        assert_eq!(floor(None, false), 0);
    }

    #[test]
    fn http_dates() {
        assert_eq!(parse_http_date("Mon, 23 Nov 2026 08:07:17 GMT"), at(1_795_421_237, 0));
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), at(0, 0));
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), at(784_111_777, 0));
        assert_eq!(parse_http_date("Tue, 29 Feb 2000 23:59:59 GMT"), at(951_868_799, 0));
        assert_eq!(parse_http_date("Wed, 01 Mar 2000 00:00:00 GMT"), at(951_868_800, 0));
        for bad in ["", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "Sun, 06 Nov 1994 08:49:37 UTC"] {
            assert_eq!(parse_http_date(bad), None, "{bad:?}");
        }
        assert_eq!(parse_http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 24:49:37 GMT"), None);
    }

    /// The claim the floor rests on, played out: tokens taken through creates, takeovers and
    /// deletions, with reads in the same second as the writes before them, never repeat
    /// or go down, so long as the server's seconds never go back.
    #[test]
    fn tokens_outlive_a_deleted_object() {
        let mut last = 0u64;
        let mut chain: Option<u64> = None; // the object's token, None once deleted
        let take = |chain: Option<u64>, second: u64| match chain {
            Some(previous) => previous.max(floor(at(second, 0), true)) + 1,
            None => floor(at(second, 0), false) + 1,
        };
        let mut second = 1_700_000_000;
        for step in 0..2_000u64 {
            // Several acquisitions in one second, then a deletion within that same second.
            let created = chain.is_none();
            let token = take(chain, second);
            assert!(token > last, "step {step}: token {token} after {last}");
            (last, chain) = (token, Some(token));
            if created {
                // The creator waits until the server's clock has left the second of its read.
                assert!(!create_is_settled(at(second, 500), at(second, 999)));
                assert!(create_is_settled(at(second, 500), at(second + 1, 0)));
                second += CREATE_SETTLES_AFTER;
            }
            match step % 7 {
                0 => chain = None, // deleted at once
                3 => second += 1,  // the clock moves on
                _ => {}            // another acquisition in the same second
            }
        }
    }
}
