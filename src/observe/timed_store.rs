//! A `Store` that reports how long each request took (`Event::StoreCall`): /metrics' request
//! histogram, and /healthz's "the store answered". Installed only with --http, so a run that
//! does not ask for it pays nothing.
//!
//! Requests are timed; the waits (`changed`, `observe_change`) are not, since their length
//! is the store's news, not its speed. Every method of `Store` is forwarded, the provided
//! ones too: a default left in place here would replace the store's own (a store's `abandon`
//! that also ends its session, its `sees_expiry`) and change the run's behaviour unseen.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Event, Observer};
use crate::store::{Acquire, Lease, LockRecord, Observing, Renew, Result, Store};

pub struct TimedStore {
    inner: Arc<dyn Store>,
    observer: Arc<dyn Observer>,
}

impl TimedStore {
    pub fn new(inner: Arc<dyn Store>, observer: Arc<dyn Observer>) -> Self {
        Self { inner, observer }
    }

    async fn timed<T>(&self, operation: &'static str, request: impl Future<Output = Result<T>>) -> Result<T> {
        let mut call = Call { observer: &*self.observer, operation, started: Instant::now(), ok: None };
        let result = request.await;
        call.ok = Some(result.is_ok());
        result
    }
}

/// One request under way: reported when it ends, and also when the elector gives up on it
/// (the future is dropped at its timeout), as a request that was not answered.
struct Call<'a> {
    observer: &'a dyn Observer,
    operation: &'static str,
    started: Instant,
    ok: Option<bool>,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        self.observer.event(&Event::StoreCall { operation: self.operation, took, ok: self.ok.unwrap_or(false) });
    }
}

#[async_trait]
impl Store for TimedStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        self.timed("acquire", self.inner.acquire(lock, identity, ttl)).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        self.timed("renew", self.inner.renew(lease, ttl)).await
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        self.timed("release", self.inner.release(lease, keep)).await
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        self.timed("status", self.inner.status(lock)).await
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        self.timed("list", self.inner.list()).await
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        self.timed("revoke", self.inner.revoke(lock)).await
    }

    async fn abandon(&self, lock: &str, identity: &str) -> Result<()> {
        self.timed("abandon", self.inner.abandon(lock, identity)).await
    }

    async fn longest_ttl(&self, wanted: Duration) -> Result<Option<Duration>> {
        self.inner.longest_ttl(wanted).await
    }

    async fn failover(&self) -> Result<Option<Duration>> {
        self.inner.failover().await
    }

    async fn longest_keep(&self) -> Result<Option<Duration>> {
        self.inner.longest_keep().await
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        self.inner.changed(lock, max_wait).await
    }

    async fn stop_waiting(&self, lock: &str) {
        self.inner.stop_waiting(lock).await
    }

    fn sees_expiry(&self) -> bool {
        self.inner.sees_expiry()
    }

    fn observing(&self) -> Observing {
        self.inner.observing()
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        self.inner.observe_change(lock, max_wait).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TokioClock;
    use crate::store::memory::MemoryStore;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Calls(Mutex<Vec<(&'static str, bool)>>);

    impl Observer for Calls {
        fn event(&self, event: &Event<'_>) {
            if let Event::StoreCall { operation, ok, .. } = *event {
                self.0.lock().unwrap().push((operation, ok));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_request_is_reported_once_and_a_dropped_one_as_unanswered() {
        let calls = Arc::new(Calls::default());
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(Arc::new(TokioClock::new())));
        let store = TimedStore::new(inner.clone(), calls.clone());
        let ttl = Duration::from_secs(10);
        let Ok(Acquire::Won(lease)) = store.acquire("l", "me", ttl).await else { panic!("not won") };
        store.renew(&lease, ttl).await.unwrap();
        store.status("l").await.unwrap();
        store.changed("l", Duration::from_millis(10)).await;
        assert_eq!(store.sees_expiry(), inner.sees_expiry());
        assert_eq!(store.observing(), inner.observing());
        store.release(&lease, Duration::ZERO).await.unwrap();
        let never = store.timed("revoke", std::future::pending::<Result<()>>());
        assert!(tokio::time::timeout(Duration::from_millis(5), never).await.is_err());
        assert_eq!(
            *calls.0.lock().unwrap(),
            [("acquire", true), ("renew", true), ("status", true), ("release", true), ("revoke", false)]
        );
    }
}
