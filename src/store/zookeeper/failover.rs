//! Riding out the loss or freeze of one server of an ensemble: what the client library does,
//! and the little it lacks.
//!
//! What zookeeper-client 0.11 does (its `session/mod.rs` and `endpoint.rs`): a session is given
//! every host of the URL; it connects to one of them in a shuffled order, trying each once
//! (`with_fail_eagerly`: a host that refuses costs a round trip, then the next is tried). Once
//! connected, it declares the connection dead when nothing has come from the server for its
//! connection timeout (2/5 of the session timeout unless set), pinging after 3/8 of that idle,
//! and then reconnects the same session to the hosts in a new shuffled order, trying each in
//! turn (a refusing one in a round trip, a frozen one, which accepts the TCP connection and
//! never answers, in a connection timeout), until 7/5 of the session timeout have passed.
//! A server that dies closes its connections: the move starts at once.
//!
//! What it lacks, for leases: a frozen server is found only after 2/5 of the session timeout
//! (8.3 s for the default ttl's 20.75 s session), and a move may try the frozen server once
//! more before another: up to 16.6 s, while a holder at the default ttl stops its child about
//! 9.5 s after its last confirmed renewal. So a lease's session is given a connection timeout
//! of a tenth of its session timeout (`connection_timeout`): frozen or dead, its server is left
//! within two of those (4.2 s at the default ttl), before the next renewal is due. And a request
//! on a session whose connection is being moved failed at once: it now waits for the move,
//! within its own bound, and a read whose connection died under it is sent again on the moved
//! session (`read_moving`), so the renewal due during a move confirms instead of failing.
//!
//! Why a renewal stays sound: it confirms only on an answer to a request sent after the
//! holder read its clock (`sent`). Either that request went over the connection that was live
//! before `sent` (the client is never silent on it for more than half its connection timeout,
//! a twentieth of the session timeout, less than the fifth `session_for` allows for), or over
//! a connection made after `sent`: a server takes a reconnecting session only once the leader
//! has revalidated it, which touches the session on the leader's clock, after `sent`. Either
//! way the leader cannot expire the session before `sent` + ttl.

use std::future::Future;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};
use zookeeper_client::{Client, Error as ZkError, SessionState};

use super::timeouts::REQUEST_TIMEOUT;

/// The connection timeout for a session of `session` (asked): a tenth of it, at least 2 s
/// (a busy server or machine must not look dead: a connection declared dead fails the write
/// on it) and at most the library's own 2/5.
pub(super) fn connection_timeout(session: Duration) -> Duration {
    (session / 10).max(Duration::from_secs(2)).min(session * 2 / 5)
}

/// Wait until the session is connected again, at most until `until`: whether it is.
pub(super) async fn until_connected(client: &Client, until: Instant) -> bool {
    let mut states = client.state_watcher();
    let connected = |s: SessionState| matches!(s, SessionState::SyncConnected | SessionState::ConnectedReadOnly);
    timeout_at(until, async {
        loop {
            let state = states.peek_state();
            if state != SessionState::Disconnected {
                return connected(state);
            }
            states.changed().await;
        }
    })
    .await
    .unwrap_or(false)
}

/// A read (or a `sync`) on a session, bounded by `REQUEST_TIMEOUT` in all: sent once the session
/// is connected, and sent again if its connection died under it (the library then moves the
/// session to another server). Only for requests that may be sent twice.
pub(super) async fn read_moving<'a, T, F>(
    op: &'static str,
    client: &'a Client,
    f: impl Fn(&'a Client) -> F,
) -> std::result::Result<T, ZkError>
where
    F: Future<Output = std::result::Result<T, ZkError>> + 'a,
{
    let until = Instant::now() + REQUEST_TIMEOUT;
    loop {
        if !until_connected(client, until).await {
            return Err(match client.state() {
                SessionState::Disconnected => ZkError::ConnectionLoss,
                SessionState::AuthFailed => ZkError::AuthFailed,
                SessionState::Expired => ZkError::SessionExpired,
                _ => ZkError::ClientClosed,
            });
        }
        tracing::trace!(op, "store request");
        match timeout_at(until, f(client)).await {
            Err(_) => return Err(ZkError::Timeout),
            Ok(Err(ZkError::ConnectionLoss)) if Instant::now() < until => continue,
            Ok(result) => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_of_the_session_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(connection_timeout(ms(20_750)), ms(2075));
        assert_eq!(connection_timeout(ms(4000)), ms(1600), "never above the library's 2/5");
        assert_eq!(connection_timeout(ms(10_000)), ms(2000));
    }
}
