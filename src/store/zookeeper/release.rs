//! Releasing in one step: the lease's child, the --min-hold child in its place, and this
//! store's node in the lock's queue, in one multi-op.

use std::time::Duration;

use zookeeper_client::{CreateMode, Error as ZkError, MultiWriteError};

use super::sessions::{request, Zk};
use super::value::{now_ms, Value};
use super::ZooKeeperStore;

/// How a release in one step went.
pub(super) enum Released {
    Done,
    /// Our place in the queue was gone already: again without it.
    PlaceGone,
    /// Our child changed (revoked) or is gone: read it first.
    Changed,
}

impl ZooKeeperStore {
    /// Release in one multi-op: our child is deleted (or replaced by the --min-hold child), and
    /// our node in the lock's queue with it, so the next waiter wakes to a free lock. Guarded by
    /// the child's version as this store last saw it: a revoke has changed it.
    pub(super) async fn release_in_one(
        &self,
        zk: &Zk,
        path: &str,
        held: (&Value, i32),
        keep: Duration,
        place: Option<&str>,
    ) -> std::result::Result<Released, ZkError> {
        let (value, version) = held;
        let until_ms = value.acquired_ms.saturating_add(keep.as_millis() as u64);
        let kept = (!keep.is_zero() && until_ms > now_ms())
            .then(|| serde_json::to_vec(&Value { keep_until_ms: Some(until_ms), ..value.clone() }).unwrap());
        let options = CreateMode::Persistent.with_acls(self.acls());
        let outcome = request("release", zk, |c| {
            let mut multi = c.new_multi_writer();
            let mut added = multi.add_delete(path, Some(version));
            if let Some(data) = &kept {
                added = added.and_then(|()| multi.add_create(path, data, &options));
            }
            if let Some(place) = place {
                added = added.and_then(|()| multi.add_delete(place, None));
            }
            async move {
                added?;
                Ok(multi.commit().await)
            }
        })
        .await;
        let place_index = if kept.is_some() { 2 } else { 1 };
        match outcome {
            Ok(Ok(_)) => Ok(Released::Done),
            Ok(Err(MultiWriteError::OperationFailed { index, source: ZkError::NoNode }))
                if place.is_some() && index == place_index =>
            {
                Ok(Released::PlaceGone)
            }
            Ok(Err(MultiWriteError::OperationFailed { index: 0, source: ZkError::BadVersion | ZkError::NoNode })) => {
                Ok(Released::Changed)
            }
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(e),
        }
    }
}
