//! The session pool: a spare session for reads and watches, and one session per lease.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::{timeout, Instant};
use zookeeper_client::{Client, Connector, Error as ZkError, SessionState};

use super::timeouts::{LONGEST_SESSION_ASKED, SPARE_SESSION};
use super::ZooKeeperStore;
use crate::store::Result;

/// Bound on every request (the elector bounds its calls too, usually tighter).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Leases whose session this store gave up, remembered so that they are never renewed.
const ABANDONED_KEPT: usize = 1024;

/// How long a connection attempt to one server may take while learning the longest session:
/// that session's own timeout would give a server that does not answer days.
const PROBE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

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
}

/// A lease this store acquired, on a session of its own.
pub(super) struct Held {
    pub(super) zk: Zk,
    pub(super) ttl: Duration,
    /// When the latest acquire or renew request that succeeded was sent.
    pub(super) renewed_at: Instant,
}

#[derive(Default)]
pub(super) struct Inner {
    /// A session holding no lease: for reads, and for the next acquire if its timeout fits.
    pub(super) spare: Option<Zk>,
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

    /// Any live session, for a short read.
    pub(super) fn any_live(&self) -> Option<Zk> {
        self.spare.iter().chain(self.leases.values().map(|h| &h.zk)).find(|zk| zk.live()).cloned()
    }
}

impl ZooKeeperStore {
    /// A new session asking for `timeout` (the server clamps it to its min/max). Detached: the
    /// store never closes a session, a dropped one stops heartbeating and times out.
    pub(super) async fn connect(&self, session: Duration) -> Result<Zk> {
        self.connect_with(Client::connector().with_session_timeout(session).with_detached(), session).await
    }

    /// The longest session the server grants (its maxSessionTimeout), learned by asking for one
    /// longer than any. That session is closed at once (it is not detached): a process killed
    /// before would leave it on the servers for as long.
    pub(super) async fn ask_longest_session(&self) -> Result<Duration> {
        let connector = Client::connector()
            .with_session_timeout(LONGEST_SESSION_ASKED)
            .with_connection_timeout(PROBE_CONNECTION_TIMEOUT);
        let zk = self.connect_with(connector, LONGEST_SESSION_ASKED).await?;
        Ok(zk.granted())
    }

    async fn connect_with(&self, connector: Connector, session: Duration) -> Result<Zk> {
        let mut connector = connector.with_fail_eagerly();
        if let Some((user, password)) = &self.user {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
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

    /// One request on a session, bounded by REQUEST_TIMEOUT. A session that is not connected
    /// fails at once (its requests would wait for the reconnection).
    pub(super) async fn req<'a, T, F>(
        &self,
        op: &'static str,
        zk: &'a Zk,
        f: impl FnOnce(&'a Client) -> F,
    ) -> std::result::Result<T, ZkError>
    where
        F: Future<Output = std::result::Result<T, ZkError>> + 'a,
    {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        match zk.client.state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {}
            SessionState::Disconnected => return Err(ZkError::ConnectionLoss),
            SessionState::AuthFailed => return Err(ZkError::AuthFailed),
            SessionState::Expired => return Err(ZkError::SessionExpired),
            SessionState::Closed => return Err(ZkError::ClientClosed),
        }
        match timeout(REQUEST_TIMEOUT, f(&zk.client)).await {
            Ok(result) => result,
            Err(_) => Err(ZkError::Timeout),
        }
    }

    /// A session for a short read: the spare, a lease's, or a new spare.
    pub(super) async fn read_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().any_live() {
            return Ok(zk);
        }
        self.new_spare().await
    }

    /// A session for a watch, which may last long: never a lease's (it would keep that session
    /// alive after the store gave it up).
    pub(super) async fn watch_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().spare.clone().filter(Zk::live) {
            return Ok(zk);
        }
        self.new_spare().await
    }

    pub(super) async fn new_spare(&self) -> Result<Zk> {
        let zk = self.connect(SPARE_SESSION).await?;
        let mut inner = self.inner.lock().unwrap();
        match inner.spare.clone().filter(Zk::live) {
            Some(other) => Ok(other),
            None => {
                inner.spare = Some(zk.clone());
                Ok(zk)
            }
        }
    }

    /// A session asking for `timeout` and holding no lease, taken out of the store: the spare if it
    /// fits, else a new one. Dropped (with anything an interrupted request left on it) unless
    /// given back.
    pub(super) async fn take_session(&self, session: Duration) -> Result<Zk> {
        let spare = self.inner.lock().unwrap().spare.take();
        match spare {
            Some(zk) if zk.live() && zk.requested == session => Ok(zk),
            _ => self.connect(session).await,
        }
    }

    pub(super) fn give_back(&self, zk: Zk) {
        if zk.live() {
            self.inner.lock().unwrap().spare = Some(zk);
        }
    }

    /// heartbeating, and the server expires it (and the lease) one session timeout later.
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
