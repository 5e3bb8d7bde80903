//! Reaching the master through Sentinels (`redis+sentinel://`), with the redis crate's own
//! Sentinel client.
//!
//! The crate asks the Sentinels (`SENTINEL MASTERS`) for the master of the service, skips one
//! that a Sentinel flags as down, and checks with `ROLE` that the server it names is a master.
//! The store then opens its own connection there and asks `ROLE` again on that very
//! connection before using it: the Sentinels' answer may be a moment old. That connection is
//! kept until a call on it fails in a way a retry may cure (the server went away, refused a
//! write as a replica, timed out): it is dropped then, and the next call asks the Sentinels
//! again, so that a failover moves the store to the new master. As with one address, the
//! call that met the failure fails (unavailable), and the elector retries.
//!
//! What this does not cover: a master that the Sentinels have replaced but that still takes
//! writes (a split brain, until Sentinel reconfigures it as a replica); Sentinel fences it only
//! once it can reach it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, RedisError, Role, TlsMode};

use super::{describe, error, transient, Target, TIMEOUT};
use crate::store::{Result, StoreError};

/// The master as last found: its client (for the connections of waiters and watchers), the
/// store's connection to it, and which lookup found it.
#[derive(Clone)]
struct Found {
    client: Client,
    connection: MultiplexedConnection,
    generation: u64,
}

/// The Sentinels of one store, and the master they last named.
pub(super) struct ViaSentinels {
    client: tokio::sync::Mutex<SentinelClient>,
    service: String,
    found: Mutex<Option<Found>>,
    /// Counts lookups, so that a failure on an older connection does not drop a newer one.
    lookups: AtomicU64,
    shown: String,
}

impl ViaSentinels {
    /// Ask the Sentinels for the master and connect to it, so that a wrong service name,
    /// address or password is reported before anything runs.
    pub(super) async fn open(target: &Target) -> Result<Self> {
        let sentinels = Self {
            client: tokio::sync::Mutex::new(sentinel_client(target)?),
            service: target.sentinels.as_ref().map(|s| s.service.clone()).unwrap_or_default(),
            found: Mutex::new(None),
            lookups: AtomicU64::new(0),
            shown: target.shown.clone(),
        };
        sentinels.master().await?;
        Ok(sentinels)
    }

    /// The store's connection to the master, and the lookup it came from (for `failed`).
    pub(super) async fn connection(&self) -> Result<(MultiplexedConnection, u64)> {
        self.master().await.map(|found| (found.connection, found.generation))
    }

    /// A client of the master, for a connection of its own (a waiter's, a watcher's).
    pub(super) async fn client(&self) -> Result<(Client, u64)> {
        self.master().await.map(|found| (found.client, found.generation))
    }

    /// Which lookup found the master the store uses now (0: none yet).
    pub(super) fn generation(&self) -> u64 {
        self.lookups.load(Ordering::SeqCst)
    }

    /// A call on the connection of lookup `generation` failed: if a retry may cure it (the
    /// server is gone, or no longer a master), forget that master, and ask the Sentinels again
    /// at the next call.
    pub(super) fn failed(&self, generation: u64, err: &RedisError) {
        if transient(err) {
            let mut found = self.lock();
            if found.as_ref().is_some_and(|found| found.generation == generation) {
                *found = None;
            }
        }
    }

    async fn master(&self) -> Result<Found> {
        if let Some(found) = self.lock().clone() {
            return Ok(found);
        }
        // One lookup at a time: the calls that wait here use the master it finds.
        let mut client = self.client.lock().await;
        if let Some(found) = self.lock().clone() {
            return Ok(found);
        }
        let found = tokio::time::timeout(TIMEOUT, self.find(&mut client)).await.unwrap_or_else(|_| {
            Err(StoreError::unavailable(format!(
                "Redis store {}: no Sentinel named a master of {:?} within {} s",
                self.shown,
                self.service,
                TIMEOUT.as_secs()
            )))
        })?;
        *self.lock() = Some(found.clone());
        Ok(found)
    }

    /// Ask the Sentinels for the master, connect to it, and check that it is one.
    async fn find(&self, sentinels: &mut SentinelClient) -> Result<Found> {
        let client = match sentinels.async_get_client().await {
            Ok(client) => client,
            Err(err) => return Err(self.lookup_failed(sentinels, err).await),
        };
        let at = client.get_connection_info().addr().to_string();
        let at_master = |err: RedisError| {
            let mut failure = error(&self.shown, err);
            failure.message =
                format!("{} (the master the Sentinels name for {:?}, {at})", failure.message, self.service);
            failure
        };
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(TIMEOUT)).set_response_timeout(Some(TIMEOUT));
        let mut connection = client.get_multiplexed_async_connection_with_config(&config).await.map_err(at_master)?;
        if !is_master(&mut connection).await.map_err(at_master)? {
            return Err(StoreError::unavailable(format!(
                "Redis store {}: the server the Sentinels name as the master of {:?} ({at}) is not one (a failover \
                 under way?)",
                self.shown, self.service
            )));
        }
        let generation = self.lookups.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::debug!("the Sentinels name {at} as the master of {:?}", self.service);
        Ok(Found { client, connection, generation })
    }

    /// Why no master was found, in one line: a service the Sentinels do not monitor is refused
    /// for good, one they monitor without a master that is up (a failover under way) is
    /// unavailable, and so is a Sentinel that cannot be reached.
    async fn lookup_failed(&self, sentinels: &mut SentinelClient, err: RedisError) -> StoreError {
        let shown = &self.shown;
        match err.kind() {
            ErrorKind::MasterNameNotFoundBySentinel => match monitored(sentinels).await {
                Ok(names) if !names.contains(&self.service) => StoreError::refused(format!(
                    "Redis store {shown}: the Sentinels monitor no service named {:?} (they monitor: {})",
                    self.service,
                    if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
                )),
                _ => StoreError::unavailable(format!(
                    "Redis store {shown}: no Sentinel names a master of {:?} that is up (a failover under way?)",
                    self.service
                )),
            },
            ErrorKind::InvalidClientConfig => StoreError::refused(format!(
                "Redis store {shown}: a host in the URL is not a Sentinel ({}); redis+sentinel:// names the \
                 Sentinels (port 26379 unless given), redis:// a server",
                describe(&err)
            )),
            _ if is_auth_failure(&err) => StoreError::refused(format!(
                "Redis store {shown}: authentication failed: a Sentinel or the master refused the user name or \
                 password (the URL's are the master's; Sentinels with their own take ?sentinel-user= and \
                 ?sentinel-password=)"
            )),
            _ => {
                let mut failure = error(shown, err);
                failure.message =
                    format!("{} (asking the Sentinels for the master of {:?})", failure.message, self.service);
                failure
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Found>> {
        // A call that panicked while holding it leaves nothing half-written.
        self.found.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The redis crate's Sentinel client for the target: the Sentinels' addresses and credentials,
/// and the master's user, password, database, protocol and TLS.
fn sentinel_client(target: &Target) -> Result<SentinelClient> {
    let Some(sentinels) = target.sentinels.as_deref() else {
        return Err(StoreError::refused(format!("Redis store {}: the URL names no Sentinels", target.shown)));
    };
    let tls = target.is_tls();
    let addresses = sentinels.hosts.iter().map(|(host, port)| match tls {
        true => ConnectionAddr::TcpTls { host: host.clone(), port: *port, insecure: false, tls_params: None },
        false => ConnectionAddr::Tcp(host.clone(), *port),
    });
    let invalid = |e: RedisError| target.invalid(e);
    let mut builder =
        SentinelClientBuilder::new(addresses, &sentinels.service, SentinelServerType::Master).map_err(invalid)?;
    let server = target.connection.redis_settings();
    builder = builder.set_client_to_redis_db(server.db()).set_client_to_redis_protocol(server.protocol());
    if let Some(user) = server.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = server.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(user) = &sentinels.user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &sentinels.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if tls {
        builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(certificates) = target.certificates()? {
            builder = builder
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_certificates(certificates);
        }
    }
    builder.build().map_err(invalid)
}

/// Whether the server on `connection` is a master: `ROLE`, or where this user may not run it,
/// the role `INFO replication` states.
async fn is_master(connection: &mut MultiplexedConnection) -> std::result::Result<bool, RedisError> {
    match redis::cmd("ROLE").query_async::<Role>(connection).await {
        Ok(role) => Ok(matches!(role, Role::Primary { .. })),
        Err(err) if transient(&err) => Err(err),
        Err(_) => {
            let info: String = redis::cmd("INFO").arg("replication").query_async(connection).await?;
            Ok(info.lines().any(|line| line.trim() == "role:master"))
        }
    }
}

/// The services a Sentinel monitors (`ROLE` on a Sentinel lists them).
async fn monitored(sentinels: &mut SentinelClient) -> std::result::Result<Vec<String>, RedisError> {
    let client = sentinels.async_get_sentinel_client().await?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let mut connection = client.get_multiplexed_async_connection_with_config(&config).await?;
    match redis::cmd("ROLE").query_async::<Role>(&mut connection).await? {
        Role::Sentinel { primary_names } => Ok(primary_names),
        _ => Ok(Vec::new()),
    }
}

/// Whether a Sentinel or the master refused the credentials.
fn is_auth_failure(err: &RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed || matches!(err.code(), Some("NOAUTH" | "WRONGPASS"))
}
