//! The gRPC connection to an etcd cluster: TLS, authentication, and the few calls the store
//! makes, through tonic's generic client with the hand-written messages of `wire`. Which
//! member each call goes to, and the retries on another, are `endpoints`'.
//!
//! etcd's own Rust client (etcd-client) generates these messages with `protoc` at build
//! time, which a machine with only Rust and a C compiler lacks; the calls themselves are the
//! same gRPC requests on the same HTTP/2 connection.

use std::error::Error as _;
use std::sync::RwLock;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use prost::Message;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;

use super::endpoints::Endpoints;
use super::target::Target;
use super::wire::{self, path};
use crate::store::{Result, StoreError};

/// Time to open a TCP connection (and TLS session) to one endpoint.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every request (the elector bounds its calls too, usually tighter).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection silent this long while a stream is open (a waiter's watch) is pinged, and
/// closed if the ping goes unanswered for `PING_TIMEOUT`: a frozen member answers nothing
/// and keeps its connections open, and a watch on it would otherwise wait for the elector's
/// once-a-minute re-read. etcd refuses pings more often than every 5 s (and any ping on a
/// connection without a stream), so none are sent on an idle connection.
const PING_EVERY: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The metadata key etcd reads an authentication token from.
const TOKEN_HEADER: &str = "token";

/// The metadata by which a stream asks for a member that has a leader (etcd's
/// `rpctypes.MetadataRequireLeaderKey`, set by its Go client on keep-alives and by etcdctl on
/// watches): a member without one refuses to open the stream, and ends an open one once it
/// has had no leader for three election timeouts. Without it, a watch on a member cut off
/// from the quorum stays open and silent, and its waiter learns of a release only at its
/// once-a-minute re-read.
const REQUIRE_LEADER: (&str, &str) = ("hasleader", "true");

/// A user and password for etcd's authentication. No Debug: nothing may print it.
struct Credentials {
    user: String,
    password: String,
}

/// One client of one cluster: requests go to its members as `Endpoints` chooses (one HTTP/2
/// connection per member) and carry the authentication token.
pub struct Connection {
    endpoints: Endpoints,
    credentials: Option<Credentials>,
    /// The token from the last `Authenticate` (none without credentials).
    token: RwLock<Option<AsciiMetadataValue>>,
    /// Calls that find the token expired at the same time authenticate once.
    refreshing: tokio::sync::Mutex<()>,
    /// A test's order for the copies of one request (see `Twice`).
    #[cfg(test)]
    pub(super) twice: std::sync::Mutex<Option<Twice>>,
}

/// What a test asks of the next unary call on `path`: send it twice, run `between` once the
/// first copy has landed, and return only the second copy's answer. That is a request whose
/// first copy was slow to answer, with its copy on another member answered first (see
/// `Endpoints::call`), played in a chosen order on a single member.
#[cfg(test)]
pub(super) struct Twice {
    pub path: &'static str,
    pub between: futures_util::future::BoxFuture<'static, ()>,
}

impl Connection {
    /// Set up the channels (each connects on first use) and authenticate if the URL has a user.
    pub async fn open(target: &Target) -> Result<Self> {
        let refused = |why: String| StoreError::refused(format!("etcd store {}: {why}", target.shown));
        let tls = target.tls.as_ref().map(|files| tls_config(files, &target.shown)).transpose()?;
        let mut endpoints = Vec::new();
        for url in &target.endpoints {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| refused(format!("bad endpoint {url}: {}", chain(&e))))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .http2_keep_alive_interval(PING_EVERY)
                .keep_alive_timeout(PING_TIMEOUT);
            if let Some(tls) = &tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(|e| refused(format!("TLS: {}", chain(&e))))?;
            }
            endpoints.push(endpoint);
        }
        let connection = Self {
            endpoints: Endpoints::new(endpoints),
            credentials: target
                .user
                .as_ref()
                .map(|(user, password)| Credentials { user: user.clone(), password: password.clone() }),
            token: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(()),
            #[cfg(test)]
            twice: Default::default(),
        };
        connection.authenticate().await.map_err(|status| store_error(&target.shown, &status))?;
        Ok(connection)
    }

    /// Get a token for the credentials (if any) and use it from now on.
    async fn authenticate(&self) -> std::result::Result<(), Status> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let request =
            wire::AuthenticateRequest { name: credentials.user.clone(), password: credentials.password.clone() };
        // Sent again elsewhere if need be: each answer is a new token, and unused ones lapse.
        let response: wire::AuthenticateResponse =
            self.endpoints.call(|grpc| send(grpc, path::AUTHENTICATE, request.clone(), None)).await?;
        let token = AsciiMetadataValue::try_from(response.token)
            .map_err(|_| Status::internal("etcd sent an authentication token that is not ASCII"))?;
        *self.token.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(token);
        Ok(())
    }

    fn token(&self) -> Option<AsciiMetadataValue> {
        self.token.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Run `call` with the current token; if etcd says the token is no longer valid (simple
    /// tokens lapse after `--auth-token-ttl` unused, 5 min by default; a restarted member
    /// forgets them), authenticate again and run it once more.
    async fn with_token<T, F, Fut>(&self, call: F) -> std::result::Result<T, Status>
    where
        F: Fn(Grpc<Channel>, Option<AsciiMetadataValue>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Status>>,
    {
        let sent = self.token();
        match self.endpoints.call(|grpc| call(grpc, sent.clone())).await {
            Err(status) if self.credentials.is_some() && status.code() == Code::Unauthenticated => {
                {
                    let _one_at_a_time = self.refreshing.lock().await;
                    // Another call may have refreshed it while this one waited.
                    if self.token() == sent {
                        self.authenticate().await?;
                    }
                }
                let token = self.token();
                self.endpoints.call(|grpc| call(grpc, token.clone())).await
            }
            other => other,
        }
    }

    /// One unary call, which may reach etcd twice (on two members): each request the store
    /// sends is safe to repeat (see the store's requests).
    pub async fn unary<Q, A>(&self, path: &'static str, request: Q) -> std::result::Result<A, Status>
    where
        Q: Message + Clone + 'static,
        A: Message + Default + 'static,
    {
        #[cfg(test)]
        if let Some(between) = self.twice_on(path) {
            let _lost: std::result::Result<A, Status> =
                self.with_token(|grpc, token| send(grpc, path, request.clone(), token)).await;
            between.await;
        }
        self.with_token(|grpc, token| send(grpc, path, request.clone(), token)).await
    }

    /// The test's `between` if it asked for the next call on `path` to go twice (once).
    #[cfg(test)]
    fn twice_on(&self, path: &str) -> Option<futures_util::future::BoxFuture<'static, ()>> {
        let mut twice = self.twice.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match twice.take() {
            Some(asked) if asked.path == path => Some(asked.between),
            other => {
                *twice = other;
                None
            }
        }
    }

    /// One LeaseKeepAlive: a stream opened, one request, its one answer. Whether the lease
    /// still exists (etcd answers a TTL of 0 for a lease it does not know). Safe to send
    /// twice: a keep-alive sets the lease's time left to its granted TTL, whenever it lands.
    pub async fn keep_alive(&self, id: i64) -> std::result::Result<bool, Status> {
        self.with_token(|mut grpc, token| async move {
            ready(&mut grpc).await?;
            let requests = stream::iter([wire::LeaseKeepAliveRequest { id }]);
            let path = PathAndQuery::from_static(path::LEASE_KEEP_ALIVE);
            let request = with_leader(with(Request::new(requests), token));
            let mut answers: Streaming<wire::LeaseKeepAliveResponse> =
                grpc.streaming(request, path, ProstCodec::default()).await?.into_inner();
            match answers.message().await? {
                Some(answer) => Ok(answer.ttl > 0),
                None => Err(Status::unavailable("the keep-alive stream ended without an answer")),
            }
        })
        .await
    }

    /// Open one watch stream with a watcher for each create request: their events arrive on the
    /// one stream, each carrying its key. The request side stays open (etcd would end the
    /// watchers with it), until the returned stream is dropped. A stream opened twice (the
    /// first member slow to answer) leaves one unused, dropped with the attempt.
    pub async fn watch(
        &self,
        creates: Vec<wire::WatchCreateRequest>,
    ) -> std::result::Result<Streaming<wire::WatchResponse>, Status> {
        self.with_token(|mut grpc, token| {
            let requests: Vec<_> = creates
                .iter()
                .map(|create| wire::WatchRequest {
                    request_union: Some(wire::WatchRequestUnion::CreateRequest(create.clone())),
                })
                .collect();
            async move {
                ready(&mut grpc).await?;
                let requests = stream::iter(requests).chain(stream::pending());
                let path = PathAndQuery::from_static(path::WATCH);
                let request = with_leader(with(Request::new(requests), token));
                Ok(grpc.streaming(request, path, ProstCodec::default()).await?.into_inner())
            }
        })
        .await
    }

    /// Revoke an etcd lease (which deletes every key attached to it); false if etcd does not
    /// know it (it lapsed, or was revoked already: a revoke sent twice finds it gone).
    pub async fn lease_revoke(&self, id: i64) -> std::result::Result<bool, Status> {
        match self.unary::<_, wire::LeaseRevokeResponse>(path::LEASE_REVOKE, wire::LeaseRevokeRequest { id }).await {
            Ok(_) => Ok(true),
            Err(status) if is_lease_not_found(&status) => Ok(false),
            Err(status) => Err(status),
        }
    }

    /// Time left on an etcd lease, on the etcd leader's clock; `None` if it has lapsed.
    pub async fn lease_left(&self, id: i64) -> std::result::Result<Option<Duration>, Status> {
        let request = wire::LeaseTimeToLiveRequest { id };
        match self.unary::<_, wire::LeaseTimeToLiveResponse>(path::LEASE_TIME_TO_LIVE, request).await {
            Ok(answer) if answer.ttl >= 0 => Ok(Some(Duration::from_secs(answer.ttl as u64))),
            Ok(_) => Ok(None),
            Err(status) if is_lease_not_found(&status) => Ok(None),
            Err(status) => Err(status),
        }
    }
}

/// Wait until the channel takes a request.
async fn ready(grpc: &mut Grpc<Channel>) -> std::result::Result<(), Status> {
    grpc.ready().await.map_err(|e| Status::unavailable(format!("the connection is not ready: {}", chain(&e))))
}

/// A request with the token attached, if there is one.
fn with<T>(mut request: Request<T>, token: Option<AsciiMetadataValue>) -> Request<T> {
    if let Some(token) = token {
        request.metadata_mut().insert(TOKEN_HEADER, token);
    }
    request
}

/// A stream's request that asks for a member with a leader (see `REQUIRE_LEADER`).
fn with_leader<T>(mut request: Request<T>) -> Request<T> {
    let (key, value) = REQUIRE_LEADER;
    request.metadata_mut().insert(key, AsciiMetadataValue::from_static(value));
    request
}

async fn send<Q, A>(
    mut grpc: Grpc<Channel>,
    path: &'static str,
    request: Q,
    token: Option<AsciiMetadataValue>,
) -> std::result::Result<A, Status>
where
    Q: Message + 'static,
    A: Message + Default + 'static,
{
    ready(&mut grpc).await?;
    let path = PathAndQuery::from_static(path);
    Ok(grpc.unary(with(Request::new(request), token), path, ProstCodec::default()).await?.into_inner())
}

/// etcd's "requested lease not found".
fn is_lease_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound && status.message().contains("lease not found")
}

/// The client's TLS settings: the CA file or else the system's CAs, and a client certificate.
fn tls_config(files: &crate::store::url::TlsFiles, shown: &str) -> Result<ClientTlsConfig> {
    let read = |param: &str, path: &Option<String>| crate::store::read_url_file("etcd", shown, param, path.as_deref());
    let mut config = match read("cacert", &files.cacert)? {
        Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (read("cert", &files.cert)?, read("key", &files.key)?) {
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(config)
}

/// An error and its causes, on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}

/// One line describing a failed call: etcd's message and the gRPC code, or why the server
/// could not be reached.
pub fn describe(status: &Status) -> String {
    let text = match status.source().map(chain) {
        Some(causes) if causes.contains(status.message()) => format!("cannot reach the server: {causes}"),
        Some(causes) => format!("cannot reach the server: {}: {causes}", status.message()),
        None => format!("{} ({:?})", status.message(), status.code()),
    };
    text.replace('\n', " ")
}

/// A failed call as the elector sees it: transient or refused, in one line without the password
/// (`shown` is the URL without it).
pub fn store_error(shown: &str, status: &Status) -> StoreError {
    let message = format!("etcd store {shown}: {}", describe(status));
    if is_transient(status) {
        StoreError::unavailable(message)
    } else {
        StoreError::refused(message)
    }
}

/// Whether a failed call may pass on retry: unreachable, timed out, no leader, overloaded.
/// Bad credentials, missing permissions, invalid requests and TLS refusals will not.
pub fn is_transient(status: &Status) -> bool {
    if crate::store::is_tls_refusal(&describe(status)) {
        return false;
    }
    // etcd's "invalid user ID or password" is InvalidArgument; "authentication is not
    // enabled" (a user given to a cluster without auth) is FailedPrecondition.
    !matches!(
        status.code(),
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::Unimplemented
            | Code::Unauthenticated
    )
}
