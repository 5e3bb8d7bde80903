//! The sessions: one for reads, watches and the queue, one per lease, and a spare of a lease's
//! size for the next acquire.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::{timeout, timeout_at, Instant};
use zookeeper_client::{Client, Connector, Error as ZkError, SessionState};

use super::failover::{connection_timeout, until_connected};
use super::timeouts::{READS_SESSION, REQUEST_TIMEOUT};
use super::value::Value;
use super::ZooKeeperStore;
use crate::store::Result;

/// Leases whose session this store gave up, remembered so that they are never renewed.
const ABANDONED_KEPT: usize = 1024;
/// How much longer than a lease needs a spare session may last and still be used for it: a
/// takeover after a crash comes at most that much later. It lets the session that learned the
/// servers' longest (`learn_longest_ttl`) serve the lease of the longest ttl within it, whose
/// session is shorter by the rounding of `longest_ttl_within` only.
const SPARE_SLACK: Duration = Duration::from_millis(10);

/// One session.
#[derive(Clone)]
pub(super) struct Zk {
    pub(super) client: Client,
    /// The timeout asked for (the server may have granted another).
    pub(super) requested: Duration,
}

impl Zk {
    pub(super) fn live(&self) -> bool {
        !self.client.state().is_terminated()
    }

    pub(super) fn id(&self) -> i64 {
        self.client.session_id().0
    }

    pub(super) fn granted(&self) -> Duration {
        self.client.session_timeout()
    }

    /// Whether a lease whose session must last `wanted` may use this one: asked for just that,
    /// or granted at least that and at most `SPARE_SLACK` more.
    fn fits(&self, wanted: Duration) -> bool {
        self.live()
            && (self.requested == wanted || (self.granted() >= wanted && self.granted() <= wanted + SPARE_SLACK))
    }
}

/// A lease this store acquired, on a session of its own.
pub(super) struct Held {
    pub(super) zk: Zk,
    pub(super) ttl: Duration,
    /// When the latest acquire or renew request that succeeded was sent.
    pub(super) renewed_at: Instant,
    /// The child's data as written, and its data version as last seen (0 when created; a revoke
    /// changes it): release deletes it without reading it first.
    pub(super) value: Value,
    pub(super) version: i32,
}

#[derive(Default)]
pub(super) struct Inner {
    /// The reads session: reads, watches and this store's place in a queue; never a lease's (a
    /// watch would keep a lease's session alive after the store gave it up).
    pub(super) reads: Option<Zk>,
    /// A session of a lease's size holding no lease: the next acquire's, if it fits.
    pub(super) spare: Option<Zk>,
    /// The session timeout the latest acquire needed: a waiting store connects its next lease's
    /// session while it waits (`ready_lease_session`).
    pub(super) wanted: Option<Duration>,
    /// Lease child path → its session.
    pub(super) leases: HashMap<String, Held>,
    /// Lease child paths whose session this store gave up (newest last).
    pub(super) abandoned: VecDeque<String>,
}

impl Inner {
    pub(super) fn abandon(&mut self, path: &str) {
        self.leases.remove(path);
        if !self.abandoned.iter().any(|p| p == path) {
            self.abandoned.push_back(path.to_string());
        }
        while self.abandoned.len() > ABANDONED_KEPT {
            self.abandoned.pop_front();
        }
    }

    /// Any live session, for a short read: the reads session first.
    fn any_live(&self) -> Option<Zk> {
        let mut all = self.reads.iter().chain(&self.spare).chain(self.leases.values().map(|h| &h.zk));
        all.find(|zk| zk.live()).cloned()
    }
}

/// How long a release waits for its session to reconnect, if it lost its connection (a process
/// resumed after a freeze: the client library drops a connection silent for 2/5 of the session
/// timeout, and reconnects in a round trip or two). Failing at once would leave the lock to
/// lapse with the session instead of freeing it now.
const RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// Wait (at most `RECONNECT_WAIT`) while the session is reconnecting.
pub(super) async fn reconnected(zk: &Zk) {
    let mut states = zk.client.state_watcher();
    let _ = timeout(RECONNECT_WAIT, async {
        while states.peek_state() == SessionState::Disconnected {
            states.changed().await;
        }
    })
    .await;
}

/// One request on a session, bounded by REQUEST_TIMEOUT. A session that is not connected (its
/// connection is being moved to another server) is waited for within that bound, and the
/// request sent once it is.
pub(super) async fn request<'a, T, F>(
    op: &'static str,
    zk: &'a Zk,
    f: impl FnOnce(&'a Client) -> F,
) -> std::result::Result<T, ZkError>
where
    F: Future<Output = std::result::Result<T, ZkError>> + 'a,
{
    // One line per request at -vvv: the benchmarks and the tests count them.
    let until = Instant::now() + REQUEST_TIMEOUT;
    until_connected(&zk.client, until).await;
    tracing::trace!(op, "store request");
    match zk.client.state() {
        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {}
        SessionState::Disconnected => return Err(ZkError::ConnectionLoss),
        SessionState::AuthFailed => return Err(ZkError::AuthFailed),
        SessionState::Expired => return Err(ZkError::SessionExpired),
        SessionState::Closed => return Err(ZkError::ClientClosed),
    }
    match timeout_at(until, f(&zk.client)).await {
        Ok(result) => result,
        Err(_) => Err(ZkError::Timeout),
    }
}

impl ZooKeeperStore {
    /// A new session asking for `timeout` (the server clamps it to its min/max). Detached: the
    /// store never closes a session, a dropped one stops heartbeating and times out. Its
    /// connection is declared dead after `connection_timeout` of silence, and the session then
    /// moves to another server (`failover.rs`).
    pub(super) async fn connect(&self, session: Duration) -> Result<Zk> {
        let mut connector: Connector = Client::connector()
            .with_session_timeout(session)
            .with_connection_timeout(connection_timeout(session))
            .with_detached()
            .with_fail_eagerly();
        if let Some((user, password)) = &self.user {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        // A connect is a request too: the server creates the session (a write, through the leader).
        tracing::trace!(op = "connect", "store request");
        let connecting: std::pin::Pin<Box<dyn Future<Output = std::result::Result<Client, ZkError>> + Send>> =
            match &self.tls {
                Some(tls) => Box::pin(connector.with_tls(tls.clone()).secure_connect(&self.hosts)),
                None => Box::pin(connector.connect(&self.hosts)),
            };
        match timeout(REQUEST_TIMEOUT, connecting).await {
            Ok(Ok(client)) => Ok(Zk { client, requested: session }),
            Ok(Err(e)) => Err(self.error("connect", &e)),
            Err(_) => Err(self.error("connect", &ZkError::Timeout)),
        }
    }

    /// A session for a short read: the reads session, a lease's, or a new reads session.
    pub(super) async fn read_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().any_live() {
            return Ok(zk);
        }
        self.new_reads_session().await
    }

    /// A session for a watch, which may last long, and for a place in a queue: the reads session.
    pub(super) async fn watch_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().reads.clone().filter(Zk::live) {
            return Ok(zk);
        }
        self.new_reads_session().await
    }

    /// The reads session is gone (expired, or given up by the client library): a new one.
    async fn new_reads_session(&self) -> Result<Zk> {
        let zk = self.connect(READS_SESSION).await?;
        let mut inner = self.inner.lock().unwrap();
        match inner.reads.clone().filter(Zk::live) {
            Some(other) => Ok(other),
            None => {
                inner.reads = Some(zk.clone());
                Ok(zk)
            }
        }
    }

    /// The spare, if it was asked for `wanted` and the servers cut it short: what they granted
    /// (a new session would get no more).
    pub(super) fn spare_cut_short(&self, wanted: Duration) -> Option<Duration> {
        let inner = self.inner.lock().unwrap();
        let spare = inner.spare.as_ref().filter(|zk| zk.live() && zk.requested == wanted)?;
        (spare.granted() < wanted).then(|| spare.granted())
    }

    /// A session for a lease whose session must last `wanted`, taken out of the store: the spare
    /// if it fits, else a new one. Dropped (with anything an interrupted request left on it)
    /// unless given back.
    pub(super) async fn take_session(&self, wanted: Duration) -> Result<Zk> {
        let spare = self.inner.lock().unwrap().spare.take_if(|zk| zk.fits(wanted));
        match spare {
            Some(zk) => Ok(zk),
            None => self.connect(wanted).await,
        }
    }

    /// A session that holds no lease becomes the spare.
    pub(super) fn give_back(&self, zk: Zk) {
        if zk.live() {
            self.inner.lock().unwrap().spare = Some(zk);
        }
    }

    /// A waiting store connects the session of its next lease now, so that its turn does not
    /// wait for a connect. Whether that session is long enough (if not, the next acquire says so).
    pub(super) async fn ready_lease_session(&self) -> Result<bool> {
        let (wanted, spare) = {
            let inner = self.inner.lock().unwrap();
            (inner.wanted, inner.spare.clone())
        };
        let Some(wanted) = wanted else { return Ok(true) };
        if let Some(spare) = spare.filter(|zk| zk.fits(wanted)) {
            return Ok(spare.granted() >= wanted);
        }
        let zk = self.connect(wanted).await?;
        let long_enough = zk.granted() >= wanted;
        self.give_back(zk);
        Ok(long_enough)
    }

    /// Give a lease's session up once `ttl` has passed since its latest successful renewal: it
    /// stops heartbeating, and the server expires it (and the lease) one session timeout later.
    pub(super) fn expire_unrenewed(&self, path: String) {
        let inner: Weak<Mutex<Inner>> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let due = {
                    let Some(inner) = inner.upgrade() else { return };
                    let guard = inner.lock().unwrap();
                    match guard.leases.get(&path) {
                        Some(held) => held.renewed_at + held.ttl,
                        None => return,
                    }
                };
                tokio::time::sleep_until(due).await;
                let Some(inner) = inner.upgrade() else { return };
                let mut guard = inner.lock().unwrap();
                match guard.leases.get(&path) {
                    Some(held) if held.renewed_at + held.ttl <= Instant::now() => {
                        tracing::debug!(path, "lease not renewed within its ttl; its session is given up");
                        guard.abandon(&path);
                        return;
                    }
                    Some(_) => continue,
                    None => return,
                }
            }
        });
    }

    /// A lease of ours is over (released, or abandoned): its session holds nothing now and is kept
    /// as the spare, which the next acquire with the same ttl reuses.
    pub(super) fn retire(&self, path: &str) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(held) = inner.leases.remove(path) {
            if held.zk.live() && inner.spare.as_ref().is_none_or(|s| !s.live() || s.requested != held.zk.requested) {
                inner.spare = Some(held.zk);
            }
        }
    }

    /// Forget a lease of ours whose session is gone or given up.
    pub(super) fn forget(&self, path: &str) {
        self.inner.lock().unwrap().abandon(path);
    }
}
