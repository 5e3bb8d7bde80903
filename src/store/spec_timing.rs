//! What the run's timings need to know of a store before anything connects, from its URL
//! alone: whether expiry is judged on the servers' wall clocks (--server-clock-skew counts),
//! and a failover longer than the defaults ride out.

use std::time::Duration;

use super::url::StoreSpec;

impl StoreSpec {
    /// The store's failover as the URL alone tells it (`Store::failover`), known before anything
    /// connects, so that opening the store rides it out too: a NATS bucket asked for with
    /// `?replicas=` above 1. Zero for any other.
    pub fn known_failover(&self) -> Duration {
        match self {
            #[cfg(feature = "nats")]
            StoreSpec::Nats(target) => target.failover().unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }

    /// Whether the store judges expiry on its servers' wall clocks, so that a failover to a
    /// server whose clock differs moves every lease's expiry by the difference.
    pub fn expiry_on_server_wall_clock(&self) -> bool {
        match self {
            StoreSpec::Sqlite { .. } => false,
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(_) => true,
            #[cfg(feature = "mysql")]
            StoreSpec::MySql(_) => true,
            #[cfg(feature = "redis")]
            StoreSpec::Redis(_) => true,
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd(_) => false,
            #[cfg(feature = "nats")]
            StoreSpec::Nats(_) => true,
            #[cfg(feature = "zookeeper")]
            StoreSpec::ZooKeeper(_) => false,
            // Client-timed: no expiry on the server at all.
            #[cfg(feature = "kubernetes")]
            StoreSpec::Kubernetes(_) => false,
            // Client-timed: no lease is judged on any server's clock.
            #[cfg(feature = "s3")]
            StoreSpec::S3(_) => false,
            #[cfg(feature = "gcs")]
            StoreSpec::Gcs(_) => false,
            // Client-timed too.
            #[cfg(feature = "datastore")]
            StoreSpec::Datastore(_) => false,
        }
    }
}
