//! How the store reaches the server that takes its writes: at one address, through a
//! `ConnectionManager` that reconnects there by itself after a restart; or through Sentinels
//! (`sentinel.rs`), asked again for the master after any connection failure, since a failover
//! moves it.
//!
//! Either way a call that meets a failure fails (unavailable) and the elector retries: one
//! attempt per reconnection.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::sentinel::ViaSentinels;
use super::{error, Target, TIMEOUT};
use crate::store::Result;

/// One per store, behind an `Arc`: its size costs nothing, so neither variant is boxed.
#[allow(clippy::large_enum_variant)]
pub(super) enum Link {
    Direct { client: Client, manager: ConnectionManager },
    Sentinels(ViaSentinels),
}

/// A connection for one call.
#[derive(Clone)]
pub(super) enum Connection {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
}

impl Link {
    /// Connect now, so that a bad address, password or service name is reported before
    /// anything runs.
    pub(super) async fn open(target: &Target) -> Result<Self> {
        if target.sentinels.is_some() {
            return ViaSentinels::open(target).await.map(Link::Sentinels);
        }
        let client = target.client()?;
        // One attempt per reconnection: the elector retries failed calls on its own schedule.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(0);
        let manager =
            ConnectionManager::new_with_config(client.clone(), config).await.map_err(|e| error(&target.shown, e))?;
        Ok(Link::Direct { client, manager })
    }

    /// The connection a call is made on, and which master it reaches (for `failed`).
    pub(super) async fn connection(&self) -> Result<(Connection, u64)> {
        match self {
            Link::Direct { manager, .. } => Ok((Connection::Manager(manager.clone()), 0)),
            Link::Sentinels(sentinels) => {
                sentinels.connection().await.map(|(connection, at)| (Connection::Multiplexed(connection), at))
            }
        }
    }

    /// A call on `connection(at)` failed with `err`.
    pub(super) fn failed(&self, at: u64, err: &RedisError) {
        if let Link::Sentinels(sentinels) = self {
            sentinels.failed(at, err);
        }
    }

    /// A client of the server, for connections of their own (a waiter's BLPOP, a watcher's
    /// subscription), and which master it reaches.
    pub(super) async fn client(&self) -> Result<(Client, u64)> {
        match self {
            Link::Direct { client, .. } => Ok((client.clone(), 0)),
            Link::Sentinels(sentinels) => sentinels.client().await,
        }
    }

    /// Which master the store's calls reach now: a connection made for another is stale.
    pub(super) fn generation(&self) -> u64 {
        match self {
            Link::Direct { .. } => 0,
            Link::Sentinels(sentinels) => sentinels.generation(),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Manager(c) => c.req_packed_command(cmd),
            Connection::Multiplexed(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Manager(c) => c.get_db(),
            Connection::Multiplexed(c) => c.get_db(),
        }
    }
}
