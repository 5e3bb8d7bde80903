//! The session pool: a spare session for reads and watches, and one session per lease.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::{timeout, Instant};
use zookeeper_client::{Client, Error as ZkError, SessionState};

use super::ZooKeeperStore;
use crate::store::Result;

/// Bound on every request (the elector bounds its calls too, usually tighter).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// leaderrun's default --ttl: sessions opened to read are made for it, so that a run with the
/// default reuses its first session for the lease.
pub(super) const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// Leases whose session this store gave up, remembered so that they are never renewed.
const ABANDONED_KEPT: usize = 1024;

/// Milliseconds, rounded up, at least 1: ZooKeeper's session timeouts are whole ms.
pub(super) fn ceil_ms(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000) as u64).max(1)
}

/// The session timeout a lease of `ttl` needs: a quarter more, rounded up to whole ms.
///
/// A server passes its clients' activity on to the leader (which expires sessions) at its next
/// tick; one that loses the leader right after answering a renewal may never pass that one on,
/// and the leader then times the session from the client's activity before it. The client
/// library is never silent for more than a fifth of the session timeout (it heartbeats after
/// 3/20 of it, checked every 1/20), so the session lasts at least 4/5 of its timeout after any
/// renewal was sent: 4/5 × 5/4 × ttl = ttl.
pub(super) fn session_for(ttl: Duration) -> Duration {
    Duration::from_millis(ceil_ms(ttl).saturating_mul(5).div_ceil(4))
}

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
        let mut connector = Client::connector().with_session_timeout(session).with_detached().with_fail_eagerly();
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
        let zk = self.connect(session_for(DEFAULT_TTL)).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(300_001)), 301);
        assert_eq!(ceil_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(ceil_ms(Duration::ZERO), 1);
        assert_eq!(session_for(Duration::from_secs(15)), Duration::from_millis(18_750));
        assert_eq!(session_for(Duration::from_millis(1001)), Duration::from_millis(1252));
    }
}
