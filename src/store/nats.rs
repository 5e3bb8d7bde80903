//! SCAFFOLD: replaced by the NATS JetStream KV store.
use std::time::Duration;

use async_trait::async_trait;

use super::url::Access;
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

pub struct NatsStore;

impl NatsStore {
    pub async fn open(_url: &str, _access: Access) -> Result<Self> {
        Err(StoreError::refused("scaffold"))
    }
}

#[async_trait]
impl Store for NatsStore {
    async fn acquire(&self, _: &str, _: &str, _: Duration) -> Result<Acquire> {
        unreachable!()
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<Renew> {
        unreachable!()
    }
    async fn release(&self, _: &Lease, _: Duration) -> Result<()> {
        unreachable!()
    }
    async fn status(&self, _: &str) -> Result<LockRecord> {
        unreachable!()
    }
    async fn list(&self) -> Result<Vec<LockRecord>> {
        unreachable!()
    }
    async fn revoke(&self, _: &str) -> Result<Option<LockRecord>> {
        unreachable!()
    }
    async fn changed(&self, _: &str, _: Duration) {
        unreachable!()
    }
}
