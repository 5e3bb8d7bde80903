//! Wake-ups for waiters: one waiter per release, the one that has waited longest.
//!
//! A release (and a revoke that frees a kept lease) pushes one element onto the list
//! `{prefix}wake:{name}`, in the same script that frees the lock. Each waiter blocks in
//! `BLPOP` on that list, on a connection of its own: Redis hands a pushed element to exactly
//! one blocked client, the one blocked longest, so a release wakes one waiter while the
//! others stay blocked and send nothing. A herd of a hundred waiters costs a handoff the
//! release and one acquire, not a read by each.
//!
//! The element is only a hint: the acquire script stays the only way to the lease. The list
//! keeps at most one element, for `WAKE_KEEP_MS`, so that a release while no waiter was
//! blocked (one between two waits) still wakes the next waiter to block; a stale element costs
//! that waiter one acquire that finds the lock held.
//!
//! What a waiter costs the others if it dies or freezes just as its turn comes (its client
//! took the element): nobody else is woken, and the others find the lock free when they
//! re-read at the lease's expiry (the elector does, since Redis announces no expiry), at
//! most one ttl later. A waiter that dies while blocked costs nothing: Redis unblocks a
//! closed client without handing it anything.
//!
//! Releases are still published on `{prefix}released` too, for waiters of leaderrun versions
//! from before this list; and a waiter whose user may not run BLPOP (an ACL without
//! `+blpop`) subscribes there instead, as they do.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::task::JoinHandle;

use super::link::Link;

/// How long a pushed element waits in the list for a waiter to block (in ms, for the script).
/// Far longer than a waiter spends between two waits; short enough that an element left by
/// a release nobody waited for wakes a later waiter at most once, needlessly.
pub const WAKE_KEEP_MS: u64 = 10_000;

/// Longest a connection for waiting may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A BLPOP under way, on its own connection; it answers with the connection, for the next.
type Blocked = JoinHandle<(Result<(), RedisError>, MultiplexedConnection)>;

/// The blocking wait of one store.
///
/// The BLPOP is sent once and then outlives the calls that wait on it: a wait that reaches
/// its bound leaves it blocked on the server, and the next wait takes it up again. So an idle
/// standby sends nothing however often its elector waits, and keeps its place in the line.
/// It is sent again only after it has handed this waiter a turn, by the next wait.
pub struct Waker {
    link: Arc<Link>,
    state: tokio::sync::Mutex<State>,
}

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// A release handed this waiter its turn.
    Turn,
    /// The wait's bound passed.
    Bound,
    /// Another task of this process is waiting here already.
    Busy,
}

/// Each connection is kept with the master it reaches (`Link::generation`): behind Sentinels,
/// one to a master that was replaced is dropped, and the next wait blocks on the new one.
#[derive(Default)]
struct State {
    /// The BLPOP under way, if any, the key it blocks on, and its master.
    blocked: Option<(Blocked, String, u64)>,
    /// The connection of the last BLPOP that answered, for the next, and its master.
    idle: Option<(MultiplexedConnection, u64)>,
}

impl Waker {
    pub fn new(link: Arc<Link>) -> Self {
        Self { link, state: tokio::sync::Mutex::default() }
    }

    /// Wait until a release hands this waiter its turn or `max_wait` passes. A turn that came
    /// while nobody waited is returned by the next wait at once.
    pub async fn wait(&self, key: &str, max_wait: Duration) -> Result<Woke, RedisError> {
        let Ok(mut state) = self.state.try_lock() else {
            return Ok(Woke::Busy);
        };
        let master = self.link.generation();
        if state.blocked.as_ref().is_some_and(|(_, blocked_on, at)| blocked_on != key || *at != master) {
            if let Some((blocked, _, _)) = state.blocked.take() {
                blocked.abort();
            }
        }
        if state.idle.as_ref().is_some_and(|(_, at)| *at != master) {
            state.idle = None;
        }
        if state.blocked.is_none() {
            let (connection, at) = match state.idle.take() {
                Some(idle) => idle,
                None => self.connect().await?,
            };
            // One line per request at -vvv: the benchmarks count them.
            tracing::trace!(op = "wait", "store request");
            state.blocked = Some((tokio::spawn(blpop(connection, key.to_string())), key.to_string(), at));
        }
        let Some((blocked, _, at)) = state.blocked.as_mut() else { unreachable!("just set") };
        let at = *at;
        // Polling the handle does not cancel the task: at the bound, the BLPOP stays blocked.
        let Ok(answer) = tokio::time::timeout(max_wait, blocked).await else {
            return Ok(Woke::Bound);
        };
        state.blocked = None;
        let (answer, connection) = answer.map_err(|e| RedisError::from(std::io::Error::other(e.to_string())))?;
        match &answer {
            Ok(()) => state.idle = Some((connection, at)),
            Err(err) => self.link.failed(at, err),
        }
        answer.map(|_| Woke::Turn)
    }

    /// Stop waiting: a holder does not wait. Closing the connection of a BLPOP still blocked
    /// takes this waiter out of the line without a turn (Redis hands a closed client nothing).
    pub fn close(&self) {
        if let Ok(mut state) = self.state.try_lock() {
            if let Some((blocked, _, _)) = state.blocked.take() {
                blocked.abort();
            }
            state.idle = None;
        }
    }

    /// Stop waiting on `key` (`Store::stop_waiting`): a BLPOP left blocked there would take the
    /// next release's element, a turn that nobody takes then.
    pub fn leave(&self, key: &str) {
        let blocked_here =
            self.state.try_lock().is_ok_and(|state| state.blocked.as_ref().is_some_and(|(_, on, _)| on == key));
        if blocked_here {
            self.close();
        }
    }

    /// A connection with no answer timeout (a BLPOP answers only when woken), and its master.
    /// A master that cannot be found is an I/O error: a retry may find it.
    async fn connect(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        let (client, at) = self.link.client().await.map_err(|e| RedisError::from(std::io::Error::other(e.message)))?;
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT)).set_response_timeout(None);
        let connection = client.get_multiplexed_async_connection_with_config(&config).await.inspect_err(|err| {
            self.link.failed(at, err);
        })?;
        Ok((connection, at))
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        self.close();
    }
}

/// Block on `key` until an element comes (BLPOP with no timeout).
async fn blpop(mut connection: MultiplexedConnection, key: String) -> (Result<(), RedisError>, MultiplexedConnection) {
    let answer: Result<(String, String), RedisError> =
        redis::cmd("BLPOP").arg(&key).arg(0).query_async(&mut connection).await;
    (answer.map(drop), connection)
}
