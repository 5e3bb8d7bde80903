//! How long a lease's session must last, and what the server's own limits allow.

use std::time::Duration;

/// Bound on every request (the elector bounds its calls too, usually tighter).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The session the store opens first: its reads session, for reads, watches and its place in a
/// lock's queue of waiters, never a lease's. ZooKeeper's protocol does not tell a client the
/// server's tick; what it grants this session bounds it (`tick_bound`). 4 s is the
/// minSessionTimeout of a server with ZooKeeper's default 2 s tick; it is also how long a waiter
/// that died without a word stays in the queue.
pub(super) const READS_SESSION: Duration = Duration::from_secs(4);

/// Milliseconds, rounded up, at least 1: ZooKeeper's session timeouts are whole ms.
pub(super) fn ceil_ms(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000) as u64).max(1)
}

/// The most a server's tick can be, from the timeout it granted a session that asked for
/// `READS_SESSION`: half of it. A server grants at least its minSessionTimeout, which is 2 ticks
/// unless configured otherwise, so the granted timeout is at least 2 ticks. Exact on a server with
/// a tick of 2 s or more and the default minimum; on a faster-ticking one the bound is 2 s (a
/// longer session: safe, only a slower takeover after a crash). A minSessionTimeout configured
/// BELOW 2 ticks would make the bound too short: that is not supported.
pub(super) fn tick_bound(granted: Duration) -> Duration {
    Duration::from_millis(ceil_ms(granted).div_ceil(2))
}

/// The session timeout a lease of `ttl` needs on a server whose tick is at most `tick`: a quarter
/// more and a tick, in whole ms (rounded up).
///
/// The leader expires sessions, on its own clock. A follower tells it which of its clients'
/// sessions were active only when it answers the leader's ping, every half tick; a `sync` it
/// passes on to the leader does not count as activity. If the server that answered a renewal
/// loses the leader before its next ping, the leader never hears of that renewal, nor of what the
/// client did in the half tick before: it times the session from the latest activity it heard of.
/// The client library is never silent for more than a fifth of the session timeout (it heartbeats
/// after 3/20 of it, checked every 1/20). So the leader heard of activity no earlier than a fifth
/// of the timeout and half a tick before the renewal was sent, and the session lasts at least
/// 4/5 × timeout − tick/2 after it. With timeout = 5/4 × ttl + tick, that is ttl + 3/10 of a
/// tick: the lease, and room for the ping's own way to the leader.
pub(super) fn session_for(ttl: Duration, tick: Duration) -> Duration {
    Duration::from_millis(ceil_ms(ttl).saturating_mul(5).div_ceil(4).saturating_add(ceil_ms(tick)))
}

/// The longest ttl (whole ms) whose session `session_for` keeps within `longest_session`:
/// its inverse. Zero if not even a 1 ms lease fits.
pub(super) fn longest_ttl_within(longest_session: Duration, tick: Duration) -> Duration {
    let room = (longest_session.as_millis() as u64).saturating_sub(ceil_ms(tick));
    // ceil(t × 5/4) <= room  ⇔  t × 5/4 <= room (room is whole)  ⇔  t <= room × 4/5.
    Duration::from_millis(room.saturating_mul(4) / 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn timeouts_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(300_001)), 301);
        assert_eq!(ceil_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(ceil_ms(Duration::ZERO), 1);
        assert_eq!(session_for(Duration::from_secs(15), MS(2000)), MS(18_750 + 2000));
        assert_eq!(session_for(MS(1001), MS(500)), MS(1252 + 500));
    }

    #[test]
    fn the_tick_is_half_the_shortest_session() {
        assert_eq!(tick_bound(MS(4000)), MS(2000));
        assert_eq!(tick_bound(MS(6001)), MS(3001));
    }

    #[test]
    fn the_longest_ttl_is_the_inverse_of_session_for() {
        for (longest, tick) in [(10_000, 500), (10_000, 2000), (40_000, 2000), (120_000, 500), (1234, 7), (7, 7)] {
            let (longest, tick) = (MS(longest), MS(tick));
            let ttl = longest_ttl_within(longest, tick);
            if !ttl.is_zero() {
                assert!(session_for(ttl, tick) <= longest, "{ttl:?} within {longest:?}");
            }
            assert!(session_for(ttl + MS(1), tick) > longest, "{ttl:?} + 1 ms within {longest:?}");
        }
        assert_eq!(longest_ttl_within(MS(10_000), MS(2000)), MS(6400));
        assert_eq!(longest_ttl_within(MS(1000), MS(2000)), Duration::ZERO);
    }
}
