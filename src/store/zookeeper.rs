//! ZooKeeper store: `--store zk://[user:pass@]host:2181[,host2:2181...][/path]` (or `zookeeper://`).
//!
//! Nodes, under the root (`/leaderrun` unless the URL has a path):
//! - `{root}/{lock}`: one persistent node per lock name (the name percent-encoded where ZooKeeper
//!   would refuse it: `%`, `/`, control characters, the ranges ZooKeeper rejects, `.` and `..`).
//!   Never deleted: its child sequence counter is where tokens come from. Its data is the latest
//!   token, in decimal, so the status of a free lock still shows it. **Never delete these nodes by
//!   hand**: the tokens of that lock would start again.
//! - `{root}/{lock}/lease-NNNNNNNNNN`: ephemeral sequential children, data `{holder, acquired_ms,
//!   revoked, session_timeout_ms}` (JSON). The lowest-numbered child holds the lock.
//!
//! The lease is a ZooKeeper session. Each acquisition gets a session of its own whose timeout is
//! the ttl + 25% (in ms, rounded up; see `session_for` for why the quarter); its child lives as
//! long as that session does. ZooKeeper's leader expires a session when it has heard nothing from
//! its client for the session timeout, on its own clock, and rounds that up to the next expiry
//! bucket (a tick); after a leader change or a restart every session gets a fresh full timeout.
//! Expiry is only ever later, never earlier. If the server negotiates a timeout SHORTER than
//! asked (its `maxSessionTimeout`, 20 ticks by default), acquire is refused: the server could
//! expire the lease before the holder's deadline. A longer one (its `minSessionTimeout`, 2 ticks
//! by default) is safe: takeover is slower.
//!
//! - acquire: read first (a held lock needs no write); else create an ephemeral sequential child
//!   and list the children: if ours is the lowest, the lock is ours (the recipe of ZooKeeper's
//!   lock: the lowest existing child wins, so of many contenders exactly one does); if not, ours is
//!   deleted again and the lowest one's record returned.
//! - fencing token = the child's sequence number + 1 (so that 0 stays "never acquired"). Sequence
//!   numbers come from the parent's child counter, which only grows while the parent exists, and a
//!   later winner always has a later child. The winner writes its token into the parent's data
//!   (guarded by the data version, only ever larger). That counter is a signed 32-bit integer
//!   that every child creation and deletion moves on: after about a billion acquisitions of ONE
//!   lock name it would wrap, so such a lock then needs a new name (or path).
//! - renew: `sync`, then read our child ON THE SESSION THAT OWNS IT: gone → lost; revoked or
//!   another holder → lost (with the record); else renewed. The request itself tells the server
//!   the session is alive, so the leader cannot expire it before send time + ttl (`session_for`);
//!   `sync` goes through the leader, so a server cut off from it cannot confirm a renewal.
//!   Between renewals the client library's heartbeats keep the session alive too; so that a lease
//!   its holder stops renewing lapses as in every other store, the store gives a lease's session
//!   up (without closing it: no more heartbeats, the server expires it one session timeout later)
//!   once `ttl` has passed since the latest renewal request that succeeded. A renewal through
//!   another client (any client may renew with the lease) only confirms that the child exists, is
//!   ephemeral and is not revoked: it cannot touch the owner's session.
//! - release: delete our child (waiters watching it wake up). With --min-hold and time left, one
//!   multi-op replaces the ephemeral child with a persistent one at the same path, data
//!   `{..., keep_until_ms}`: it outlives the session, and an acquirer that finds it lowest and
//!   past `keep_until_ms` on ITS wall clock deletes it (guarded by version) and tries again.
//! - revoke: set `revoked` in the holder's child, guarded by version: nothing is freed.
//! - changed: a watch on the lowest child (the holder: the "predecessor" of every contender), for
//!   its deletion or change.
//!
//! What is guaranteed: ZooKeeper orders all writes through its leader (linearizable writes,
//! acknowledged by a quorum). Reads are served by the server a client is connected to, which may
//! lag: renew and status first `sync` so that they see at least every write committed before. A
//! client library that cannot reach any server for 1.4 session timeouts gives its session up; the
//! store then opens a new one, and the leases of the old one are lost (renew says so).
//!
//! What is NOT guaranteed: --min-hold is judged on wall clocks (`acquired_ms` and `keep_until_ms`
//! from the releasing host, compared on the acquiring one): it is a convenience, not part of the
//! safety contract. ZooKeeper does not tell a client how long another session has left:
//! `expires_in` of a held lock is the holder's session timeout, an upper bound. A process that
//! exits or dies without release leaves its lease until its session times out, like a killed
//! process (the store never closes a session: a dropped store's leases lapse on their own).
//! Servers before 3.5 are not supported. Each leaderrun process opens one or two connections, and
//! ZooKeeper limits the connections per client address (`maxClientCnxns`, 60 by default).
//!
//! Auth: `user:pass@` is ZooKeeper's `digest` scheme; nodes are then created with a creator-only
//! ACL, so other credentials can neither read nor change them (ZooKeeper keeps no list of users:
//! a wrong password shows as "not authorized" on the nodes the right one created).
//! TLS: `?tls=1` (the Java client's `zookeeper.client.secure=true` is accepted too) connects
//! to the servers' `secureClientPort`, trusting the CA in `&cacert=FILE` (required: ZooKeeper
//! ensembles use private CAs), with a client certificate from `&cert=FILE&key=FILE` for
//! `ssl.clientAuth=need` (all PEM). A password never appears in a message: they are built
//! from `url::redact`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::time::{timeout, Instant};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, SessionState, Stat, TlsOptions};

use super::url::{parse_cluster_url, percent_decode_bytes, redact, Access, TlsFiles};
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

/// The root node unless the URL has a path.
pub const DEFAULT_ROOT: &str = "/leaderrun";
/// Port when a host has none.
const DEFAULT_PORT: u16 = 2181;
/// Bound on every request (the elector bounds its calls too, usually tighter).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// leaderrun's default --ttl: sessions opened to read are made for it, so that a run with the
/// default reuses its first session for the lease.
const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// Guarded writes retried this often when a node changes under them before giving up.
const MAX_RACES: usize = 20;
/// Name of the lease children, before the sequence number.
const LEASE_PREFIX: &str = "lease-";
/// Leases whose session this store gave up, remembered so that they are never renewed.
const ABANDONED_KEPT: usize = 1024;

/// The data of a lease child.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    holder: String,
    /// The acquiring host's wall clock (ms since the epoch): display and --min-hold.
    acquired_ms: u64,
    #[serde(default)]
    revoked: bool,
    /// The owner session's timeout: the most the lease can have left.
    #[serde(default)]
    session_timeout_ms: u64,
    /// Set on the persistent child a release with --min-hold leaves (wall clock, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keep_until_ms: Option<u64>,
}

/// The parts of a `zk://` URL, parsed once while the command line is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// `host:port,host2:port2`, the connect string without a chroot.
    hosts: String,
    user: Option<(String, String)>,
    root: String,
    /// TLS (`?tls=1`): the PEM files of the CA (required) and of a client certificate.
    tls: Option<TlsFiles>,
}

impl Target {
    /// Parse a `zk://` or `zookeeper://` URL; the error is a bare reason, naming the part.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        parse_url(url)
    }
}

fn parse_url(url: &str) -> std::result::Result<Target, String> {
    let shown = redact(url);
    let bad = |why: &str| why.to_string();
    let expected = "expected zk://[user:pass@]host:2181[,host2:2181][/path]";
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad(expected))?;
    if !scheme.eq_ignore_ascii_case("zk") && !scheme.eq_ignore_ascii_case("zookeeper") {
        return Err(bad(expected));
    }
    let url = parse_cluster_url(rest, DEFAULT_PORT).map_err(|why| bad(&format!("{why} ({expected})")))?;
    let (mut tls, mut files) = (false, TlsFiles::default());
    for (key, value) in &url.params {
        // `zookeeper.client.secure` is the Java client's name for it.
        if matches!(key.as_str(), "tls" | "secure" | "zookeeper.client.secure") {
            tls = !matches!(value.as_str(), "0" | "false");
        } else if !files.take(key, value) {
            return Err(format!("unknown parameter ?{key}= (known: tls, cacert, cert, key)"));
        }
    }
    files.check(tls, "?tls=1, for the server's secureClientPort").map_err(|why| bad(&why))?;
    if tls && files.cacert.is_none() {
        return Err(bad("TLS needs the CA of the server's certificate: ?tls=1&cacert=FILE"));
    }
    let root = if url.path.is_empty() { DEFAULT_ROOT.to_string() } else { format!("/{}", url.path) };
    for segment in root[1..].split('/') {
        if segment.is_empty() || segment == "." || segment == ".." || segment.chars().any(refused_by_zookeeper) {
            return Err(bad(&format!("{root:?} is not a ZooKeeper path")));
        }
    }
    if root == "/zookeeper" || root.starts_with("/zookeeper/") {
        return Err(bad("/zookeeper is ZooKeeper's own subtree; choose another path"));
    }
    let user = url.userinfo.map(|(user, pass)| (user, pass.unwrap_or_default()));
    Ok(Target { shown, hosts: url.hosts.join(","), user, root, tls: tls.then_some(files) })
}

/// The client's TLS settings from the URL's PEM files: the CA, and a client certificate.
fn tls_options(files: &TlsFiles, shown: &str) -> Result<TlsOptions> {
    let read = |param: &str, path: &Option<String>| -> Result<Option<String>> {
        let bytes = super::read_url_file("zookeeper", shown, param, path.as_deref())?;
        Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
    };
    let bad = |what: &str, e: ZkError| StoreError::refused(format!("zookeeper store {shown}: {what}: {e}"));
    let mut options = TlsOptions::new();
    if let Some(ca) = read("cacert", &files.cacert)? {
        options = options.with_pem_ca(&ca).map_err(|e| bad("cacert= holds no usable certificate", e))?;
    }
    if let (Some(cert), Some(key)) = (read("cert", &files.cert)?, read("key", &files.key)?) {
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| bad("cert= and key= do not make a client identity", e))?;
    }
    Ok(options)
}

/// Characters ZooKeeper refuses in a path (its `PathUtils.validatePath`; Java sees a character
/// above U+FFFF as two surrogates, which it refuses too).
fn refused_by_zookeeper(c: char) -> bool {
    matches!(c as u32, 0..=0x1f | 0x7f..=0x9f | 0xd800..=0xf8ff | 0xfff0..)
}

/// A lock name as a node name: `%`, `/` and what ZooKeeper refuses become `%XX` (UTF-8 bytes),
/// and so does the `.` of the names `.` and `..`. Injective, undone by `decode`.
fn encode(lock: &str) -> String {
    let mut out = String::with_capacity(lock.len());
    for c in lock.chars() {
        if c == '%' || c == '/' || refused_by_zookeeper(c) || (c == '.' && (lock == "." || lock == "..")) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A node name back to the lock name (`None` if it is not one `encode` makes).
fn decode(name: &str) -> Option<String> {
    let decoded = String::from_utf8(percent_decode_bytes(name)).ok()?;
    (encode(&decoded) == name).then_some(decoded)
}

/// The sequence number of a lease child's name.
fn sequence(name: &str) -> Option<i64> {
    name.strip_prefix(LEASE_PREFIX).and_then(|n| n.parse::<i64>().ok()).filter(|n| *n >= 0)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds, rounded up, at least 1: ZooKeeper's session timeouts are whole ms.
fn ceil_ms(d: Duration) -> u64 {
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
fn session_for(ttl: Duration) -> Duration {
    Duration::from_millis(ceil_ms(ttl).saturating_mul(5).div_ceil(4))
}

/// Whether an error may pass on retry: no server reachable, connection lost, timed out,
/// throttled, session lost (a new one is opened). Missing permissions and bad requests will not.
fn transient(err: &ZkError) -> bool {
    !matches!(
        err,
        ZkError::NoAuth
            | ZkError::AuthFailed
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::Unimplemented
            | ZkError::QuotaExceeded
            | ZkError::MarshallingError
            | ZkError::NoChildrenForEphemerals
            | ZkError::UnmarshalError { .. }
    )
}

/// One line describing a ZooKeeper error.
fn describe(err: &ZkError) -> String {
    let text = match err {
        ZkError::NoAuth => {
            "not authorized (a wrong password, or nodes another user created: ZooKeeper ACLs)".to_string()
        }
        ZkError::NoHosts => "cannot reach any server: connection refused, no answer".to_string(),
        ZkError::Timeout => format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
        ZkError::ConnectionLoss => "not connected to a server (reconnecting)".to_string(),
        ZkError::SessionExpired => "the session expired".to_string(),
        ZkError::NoNode => "a node is missing (deleted by hand?)".to_string(),
        other => other.to_string(),
    };
    text.replace(['\n', '\r'], " ")
}

/// One session.
#[derive(Clone)]
struct Zk {
    client: Client,
    /// The timeout asked for (the server may have granted another).
    requested: Duration,
}

impl Zk {
    fn live(&self) -> bool {
        !self.client.state().is_terminated()
    }

    fn id(&self) -> i64 {
        self.client.session_id().0
    }

    fn granted(&self) -> Duration {
        self.client.session_timeout()
    }
}

/// A lease this store acquired, on a session of its own.
struct Held {
    zk: Zk,
    ttl: Duration,
    /// When the latest acquire or renew request that succeeded was sent.
    renewed_at: Instant,
}

#[derive(Default)]
struct Inner {
    /// A session holding no lease: for reads, and for the next acquire if its timeout fits.
    spare: Option<Zk>,
    /// Lease child path → its session.
    leases: HashMap<String, Held>,
    /// Lease child paths whose session this store gave up (newest last).
    abandoned: VecDeque<String>,
}

impl Inner {
    fn abandon(&mut self, path: &str) {
        self.leases.remove(path);
        if !self.abandoned.iter().any(|p| p == path) {
            self.abandoned.push_back(path.to_string());
        }
        while self.abandoned.len() > ABANDONED_KEPT {
            self.abandoned.pop_front();
        }
    }

    /// Any live session, for a short read.
    fn any_live(&self) -> Option<Zk> {
        self.spare.iter().chain(self.leases.values().map(|h| &h.zk)).find(|zk| zk.live()).cloned()
    }
}

/// What the lowest child of a lock says.
enum Lookup {
    /// No lease child: the latest token (from the parent's data).
    Free(u64),
    /// The lowest child (which may be a --min-hold child whose time has passed).
    Lowest { seq: i64, value: Value, stat: Stat },
}

pub struct ZooKeeperStore {
    hosts: String,
    user: Option<(String, String)>,
    /// With TLS: the client's settings, read from the URL's files once.
    tls: Option<TlsOptions>,
    root: String,
    access: Access,
    /// The URL without its password, for messages.
    shown: String,
    inner: Arc<Mutex<Inner>>,
}

/// What `acquire_on` decided.
enum Attempt {
    Won(Lease),
    /// Held by another; `clean`: our child (if we made one) is deleted, the session reusable.
    Held(LockRecord, bool),
}

impl ZooKeeperStore {
    /// Parse the URL and connect (with the digest credentials, if a user is given), then read the
    /// root once, so an unreachable ensemble or a wrong password is reported here, before anything
    /// runs. Nothing is created until a lock is acquired (only with `Access::Create`).
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let tls = match &target.tls {
            Some(files) => Some(tls_options(files, &shown)?),
            None => None,
        };
        let store = Self {
            hosts: target.hosts.clone(),
            user: target.user.clone(),
            tls,
            root: target.root.clone(),
            access,
            shown,
            inner: Arc::new(Mutex::new(Inner::default())),
        };
        let zk = store.connect(session_for(DEFAULT_TTL)).await?;
        let root = store.root.clone();
        match store.req("open", &zk, |c| c.get_data(&root)).await {
            Ok(_) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(store.error("open", &e)),
        }
        store.inner.lock().unwrap().spare = Some(zk);
        Ok(store)
    }

    fn parent(&self, lock: &str) -> String {
        format!("{}/{}", self.root, encode(lock))
    }

    fn child(&self, lock: &str, seq: i64) -> String {
        format!("{}/{LEASE_PREFIX}{seq:010}", self.parent(lock))
    }

    /// The child a lease lives in (`None` for token 0, which no lease has).
    fn lease_path(&self, lease: &Lease) -> Option<String> {
        (lease.token > 0 && lease.token <= i64::MAX as u64).then(|| self.child(&lease.lock, lease.token as i64 - 1))
    }

    fn acls(&self) -> Acls<'static> {
        if self.user.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    fn error(&self, op: &str, err: &ZkError) -> StoreError {
        let mut message = format!("zookeeper store {}: {op}: {}", self.shown, describe(err));
        if self.tls.is_some() && matches!(err, ZkError::NoHosts) {
            // The client library does not say why a TLS connection failed.
            message.push_str(" or a failed TLS handshake (check cacert=, cert= and key=; -vvv shows more)");
        }
        if transient(err) {
            StoreError::unavailable(message)
        } else {
            StoreError::refused(message)
        }
    }

    /// A new session asking for `timeout` (the server clamps it to its min/max). Detached: the
    /// store never closes a session, a dropped one stops heartbeating and times out.
    async fn connect(&self, session: Duration) -> Result<Zk> {
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
    async fn req<'a, T, F>(
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
    async fn read_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().any_live() {
            return Ok(zk);
        }
        self.new_spare().await
    }

    /// A session for a watch, which may last long: never a lease's (it would keep that session
    /// alive after the store gave it up).
    async fn watch_session(&self) -> Result<Zk> {
        if let Some(zk) = self.inner.lock().unwrap().spare.clone().filter(Zk::live) {
            return Ok(zk);
        }
        self.new_spare().await
    }

    async fn new_spare(&self) -> Result<Zk> {
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
    async fn take_session(&self, session: Duration) -> Result<Zk> {
        let spare = self.inner.lock().unwrap().spare.take();
        match spare {
            Some(zk) if zk.live() && zk.requested == session => Ok(zk),
            _ => self.connect(session).await,
        }
    }

    fn give_back(&self, zk: Zk) {
        if zk.live() {
            self.inner.lock().unwrap().spare = Some(zk);
        }
    }

    /// The data and stat of a lease child (`None` if it does not exist).
    async fn read_child(&self, op: &'static str, zk: &Zk, path: &str) -> Result<Option<(Value, Stat)>> {
        match self.req(op, zk, |c| c.get_data(path)).await {
            Ok((data, stat)) => match serde_json::from_slice::<Value>(&data) {
                Ok(value) => Ok(Some((value, stat))),
                Err(e) => Err(StoreError::refused(format!(
                    "zookeeper store {}: the node {path:?} is not leaderrun's ({e})",
                    self.shown
                ))),
            },
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// The sequence numbers of a lock's lease children, lowest first, and the parent's stat
    /// (`None` if the lock has no node).
    async fn children(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<Option<(Vec<i64>, Stat)>> {
        let parent = self.parent(lock);
        match self.req(op, zk, |c| c.get_children(&parent)).await {
            Ok((names, stat)) => {
                let mut seqs: Vec<i64> = names.iter().filter_map(|n| sequence(n)).collect();
                seqs.sort_unstable();
                Ok(Some((seqs, stat)))
            }
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// The latest token, from the parent's data.
    async fn last_token(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<u64> {
        let parent = self.parent(lock);
        match self.req(op, zk, |c| c.get_data(&parent)).await {
            Ok((data, _)) => Ok(String::from_utf8_lossy(&data).trim().parse().unwrap_or(0)),
            Err(ZkError::NoNode) => Ok(0),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// What holds a lock: its lowest lease child, read.
    async fn lookup(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<Lookup> {
        for _ in 0..MAX_RACES {
            let Some((seqs, _)) = self.children(op, zk, lock).await? else {
                return Ok(Lookup::Free(0));
            };
            let Some(&seq) = seqs.first() else {
                return Ok(Lookup::Free(self.last_token(op, zk, lock).await?));
            };
            // Gone between the two reads: look again.
            if let Some((value, stat)) = self.read_child(op, zk, &self.child(lock, seq)).await? {
                return Ok(Lookup::Lowest { seq, value, stat });
            }
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    /// The record of a lease child. A --min-hold child whose time has passed is a free lock.
    fn record(lock: &str, seq: i64, value: &Value, stat: &Stat) -> LockRecord {
        let token = seq as u64 + 1;
        let expires_in = if stat.ephemeral_owner != 0 {
            Duration::from_millis(value.session_timeout_ms)
        } else {
            let left = value.keep_until_ms.unwrap_or(0).saturating_sub(now_ms());
            if left == 0 {
                return LockRecord { token, ..LockRecord::free(lock) };
            }
            Duration::from_millis(left)
        };
        LockRecord {
            lock: lock.to_string(),
            holder: Some(value.holder.clone()),
            token,
            held_since: Some(UNIX_EPOCH + Duration::from_millis(value.acquired_ms)),
            expires_in: Some(expires_in),
            revoked: value.revoked,
        }
    }

    fn lookup_record(lock: &str, lookup: &Lookup) -> LockRecord {
        match lookup {
            Lookup::Free(token) => LockRecord { token: *token, ..LockRecord::free(lock) },
            Lookup::Lowest { seq, value, stat } => Self::record(lock, *seq, value, stat),
        }
    }

    /// Create the root and the lock's node (persistent; an existing one is fine).
    async fn ensure_parent(&self, zk: &Zk, lock: &str) -> Result<()> {
        if self.access != Access::Create {
            return Err(StoreError::refused(format!("zookeeper store {}: {} does not exist", self.shown, self.root)));
        }
        let parent = self.parent(lock);
        let options = CreateMode::Persistent.with_acls(self.acls());
        match self.req("create-parent", zk, |c| async move { c.mkdir(&parent, &options).await }).await {
            Ok(()) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.error("create-parent", &e)),
        }
    }

    /// Remember `token` as the lock's latest in the parent's data: guarded by the data version,
    /// and only ever larger. Best effort: only `status` of a free lock reads it.
    async fn record_token(&self, zk: &Zk, lock: &str, token: u64, mut version: i32) {
        let parent = self.parent(lock);
        let data = token.to_string();
        for _ in 0..MAX_RACES {
            match self.req("set-token", zk, |c| c.set_data(&parent, data.as_bytes(), Some(version))).await {
                Err(ZkError::BadVersion) => {}
                _ => return,
            }
            match self.req("get-token", zk, |c| c.get_data(&parent)).await {
                Ok((stored, stat)) => {
                    if String::from_utf8_lossy(&stored).trim().parse::<u64>().is_ok_and(|t| t >= token) {
                        return;
                    }
                    version = stat.version;
                }
                Err(_) => return,
            }
        }
    }

    /// Delete our (losing) child; whether that surely happened.
    async fn delete_ours(&self, zk: &Zk, path: &str) -> bool {
        matches!(self.req("delete", zk, |c| c.delete(path, None)).await, Ok(()) | Err(ZkError::NoNode))
    }

    async fn acquire_on(&self, zk: &Zk, lock: &str, identity: &str) -> Result<Attempt> {
        // A read first: a standby re-checking a held lock need not write.
        if let Lookup::Lowest { seq, value, stat } = self.lookup("get", zk, lock).await? {
            let record = Self::record(lock, seq, &value, &stat);
            if record.is_held() {
                return Ok(Attempt::Held(record, true));
            }
        }
        let value = Value {
            holder: identity.to_string(),
            acquired_ms: now_ms(),
            revoked: false,
            session_timeout_ms: zk.granted().as_millis() as u64,
            keep_until_ms: None,
        };
        let data = serde_json::to_vec(&value).unwrap();
        let prefix = format!("{}/{LEASE_PREFIX}", self.parent(lock));
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let mut parent_made = false;
        let ours = loop {
            match self.req("acquire", zk, |c| c.create(&prefix, &data, &options)).await {
                Ok((_, seq)) => break seq.into_i64(),
                Err(ZkError::NoNode) if !parent_made => {
                    self.ensure_parent(zk, lock).await?;
                    parent_made = true;
                }
                Err(e) => return Err(self.error("acquire", &e)),
            }
        };
        let our_path = self.child(lock, ours);
        for _ in 0..MAX_RACES {
            let Some((seqs, parent_stat)) = self.children("list", zk, lock).await? else {
                return Err(self.error("list", &ZkError::NoNode));
            };
            if !seqs.contains(&ours) {
                // Our child is gone: the session expired under us.
                return Err(self.error("acquire", &ZkError::SessionExpired));
            }
            let lowest = seqs[0];
            if lowest == ours {
                let token = ours as u64 + 1;
                self.record_token(zk, lock, token, parent_stat.version).await;
                return Ok(Attempt::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token }));
            }
            let lowest_path = self.child(lock, lowest);
            let Some((value, stat)) = self.read_child("get", zk, &lowest_path).await? else {
                continue; // freed meanwhile: look again
            };
            let record = Self::record(lock, lowest, &value, &stat);
            if !record.is_held() {
                // A --min-hold child whose time has passed: clear it and look again.
                match self.req("delete-kept", zk, |c| c.delete(&lowest_path, Some(stat.version))).await {
                    Ok(()) | Err(ZkError::NoNode) | Err(ZkError::BadVersion) => continue,
                    Err(e) => return Err(self.error("delete-kept", &e)),
                }
            }
            let clean = self.delete_ours(zk, &our_path).await;
            return Ok(Attempt::Held(record, clean));
        }
        let clean = self.delete_ours(zk, &our_path).await;
        if clean {
            self.give_back(zk.clone());
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    /// Give a lease's session up once `ttl` has passed since its latest successful renewal: it stops
    /// heartbeating, and the server expires it (and the lease) one session timeout later.
    fn expire_unrenewed(&self, path: String) {
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

    /// Read a child after a `sync`, so that a lagging server has seen every committed write.
    async fn sync_read(
        &self,
        op: &'static str,
        zk: &Zk,
        path: &str,
    ) -> std::result::Result<Option<(Value, Stat)>, ZkError> {
        match self.req("sync", zk, |c| c.sync(path)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        match self.req(op, zk, |c| c.get_data(path)).await {
            Ok((data, stat)) => Ok(serde_json::from_slice::<Value>(&data).ok().map(|v| (v, stat))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Forget a lease of ours whose session is gone or given up.
    fn forget(&self, path: &str) {
        self.inner.lock().unwrap().abandon(path);
    }

    async fn wait_change(&self, lock: &str) -> Result<()> {
        let zk = self.watch_session().await?;
        let Some((seqs, _)) = self.children("list", &zk, lock).await? else {
            return Ok(());
        };
        let Some(&lowest) = seqs.first() else {
            return Ok(());
        };
        let path = self.child(lock, lowest);
        let (stat, watcher) = match self.req("watch", &zk, |c| c.check_and_watch_stat(&path)).await {
            Ok((Some(stat), watcher)) => (stat, watcher),
            Ok((None, _)) => return Ok(()),
            Err(e) => return Err(self.error("watch", &e)),
        };
        if stat.ephemeral_owner != 0 {
            watcher.changed().await;
            return Ok(());
        }
        // A --min-hold child: it frees the lock when its time passes, or when deleted.
        let Some((value, _)) = self.read_child("get", &zk, &path).await? else {
            return Ok(());
        };
        let left = Duration::from_millis(value.keep_until_ms.unwrap_or(0).saturating_sub(now_ms()));
        tokio::select! {
            _ = watcher.changed() => {}
            _ = tokio::time::sleep(left) => {}
        }
        Ok(())
    }
}

#[async_trait]
impl Store for ZooKeeperStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let (ttl, wanted) = (Duration::from_millis(ceil_ms(ttl)), session_for(ttl));
        let zk = self.take_session(wanted).await?;
        if zk.granted() < wanted {
            let message = format!(
                "zookeeper store {}: the server grants sessions of {} ms, shorter than the {} ms a ttl of {} ms needs \
                 (ttl + 25%): raise the server's maxSessionTimeout (20 ticks by default) or use a shorter --ttl",
                self.shown,
                zk.granted().as_millis(),
                wanted.as_millis(),
                ttl.as_millis()
            );
            self.give_back(zk);
            return Err(StoreError::refused(message));
        }
        let sent = Instant::now();
        match self.acquire_on(&zk, lock, identity).await {
            Ok(Attempt::Won(lease)) => {
                let path = self.lease_path(&lease).expect("a won lease has a token");
                let held = Held { zk, ttl, renewed_at: sent };
                self.inner.lock().unwrap().leases.insert(path.clone(), held);
                self.expire_unrenewed(path);
                Ok(Acquire::Won(lease))
            }
            Ok(Attempt::Held(record, clean)) => {
                if clean {
                    self.give_back(zk);
                }
                Ok(Acquire::Held(record))
            }
            // The session is dropped: a child an ambiguous create may have left lapses with it.
            Err(e) => Err(e),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let Some(path) = self.lease_path(lease) else {
            return Ok(Renew::Lost(None));
        };
        let own = {
            let inner = self.inner.lock().unwrap();
            if inner.abandoned.contains(&path) {
                return Ok(Renew::Lost(None));
            }
            inner.leases.get(&path).map(|held| held.zk.clone())
        };
        let Some(zk) = own else {
            // Another client's lease: confirm that it is there, unrevoked and still that holder's.
            let zk = self.read_session().await?;
            return match self.sync_read("renew", &zk, &path).await {
                Ok(None) => Ok(Renew::Lost(None)),
                Ok(Some((value, stat))) => {
                    if value.holder != lease.identity || value.revoked || stat.ephemeral_owner == 0 {
                        Ok(Renew::Lost(Some(Self::record(&lease.lock, lease.token as i64 - 1, &value, &stat))))
                    } else {
                        Ok(Renew::Renewed)
                    }
                }
                Err(e) => Err(self.error("renew", &e)),
            };
        };
        if !zk.live() {
            self.forget(&path);
            return Ok(Renew::Lost(None));
        }
        let (ttl, wanted) = (Duration::from_millis(ceil_ms(ttl)), session_for(ttl));
        if zk.granted() < wanted {
            return Err(StoreError::refused(format!(
                "zookeeper store {}: cannot renew for {} ms a lease whose session times out after {} ms",
                self.shown,
                ttl.as_millis(),
                zk.granted().as_millis()
            )));
        }
        let sent = Instant::now();
        let found = match self.sync_read("renew", &zk, &path).await {
            Ok(found) => found,
            Err(ZkError::SessionExpired) | Err(ZkError::ClientClosed) => {
                self.forget(&path);
                return Ok(Renew::Lost(None));
            }
            Err(e) => return Err(self.error("renew", &e)),
        };
        let Some((value, stat)) = found else {
            self.forget(&path);
            return Ok(Renew::Lost(None));
        };
        if value.holder != lease.identity || value.revoked || stat.ephemeral_owner != zk.id() {
            return Ok(Renew::Lost(Some(Self::record(&lease.lock, lease.token as i64 - 1, &value, &stat))));
        }
        let mut inner = self.inner.lock().unwrap();
        match inner.leases.get_mut(&path) {
            Some(held) => {
                held.renewed_at = held.renewed_at.max(sent);
                held.ttl = ttl;
                Ok(Renew::Renewed)
            }
            // Given up while the request was out.
            None => Ok(Renew::Lost(None)),
        }
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let Some(path) = self.lease_path(lease) else {
            return Ok(());
        };
        let own = self.inner.lock().unwrap().leases.get(&path).map(|held| held.zk.clone()).filter(Zk::live);
        let zk = match &own {
            Some(zk) => zk.clone(),
            None => self.read_session().await?,
        };
        for _ in 0..MAX_RACES {
            let Some((value, stat)) = self.read_child("release", &zk, &path).await? else {
                break;
            };
            if value.holder != lease.identity {
                return Ok(());
            }
            let until_ms = value.acquired_ms.saturating_add(keep.as_millis() as u64);
            let result = if keep.is_zero() || until_ms <= now_ms() {
                self.req("release", &zk, |c| c.delete(&path, Some(stat.version))).await
            } else {
                // --min-hold: a persistent child in place of the ephemeral one, in one step.
                let kept = Value { keep_until_ms: Some(until_ms), ..value };
                let data = serde_json::to_vec(&kept).unwrap();
                let options = CreateMode::Persistent.with_acls(self.acls());
                let mut multi = zk.client.new_multi_writer();
                multi.add_delete(&path, Some(stat.version)).map_err(|e| self.error("release", &e))?;
                multi.add_create(&path, &data, &options).map_err(|e| self.error("release", &e))?;
                self.req("release", &zk, |_| async move { multi.commit().await.map(drop).map_err(ZkError::from) }).await
            };
            match result {
                Ok(()) | Err(ZkError::NoNode) => break,
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.error("release", &e)),
            }
        }
        // The lease's session holds nothing now: keep it as the spare.
        let mut inner = self.inner.lock().unwrap();
        if let Some(held) = inner.leases.remove(&path) {
            if held.zk.live() && inner.spare.as_ref().is_none_or(|s| !s.live() || s.requested != held.zk.requested) {
                inner.spare = Some(held.zk);
            }
        }
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let zk = self.read_session().await?;
        match self.req("sync", &zk, |c| c.sync(&self.root)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        let lookup = self.lookup("status", &zk, lock).await?;
        Ok(Self::lookup_record(lock, &lookup))
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let zk = self.read_session().await?;
        match self.req("sync", &zk, |c| c.sync(&self.root)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        let root = self.root.clone();
        let names = match self.req("list", &zk, |c| c.list_children(&root)).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error("list", &e)),
        };
        let mut locks: Vec<String> = names.iter().filter_map(|n| decode(n)).collect();
        locks.sort();
        let mut records = Vec::with_capacity(locks.len());
        for lock in locks {
            let lookup = self.lookup("status", &zk, &lock).await?;
            records.push(Self::lookup_record(&lock, &lookup));
        }
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let zk = self.read_session().await?;
        for _ in 0..MAX_RACES {
            let Lookup::Lowest { seq, value, stat } = self.lookup("get", &zk, lock).await? else {
                return Ok(None);
            };
            let before = Self::record(lock, seq, &value, &stat);
            if !before.is_held() {
                return Ok(None);
            }
            let data = serde_json::to_vec(&Value { revoked: true, ..value }).unwrap();
            let path = self.child(lock, seq);
            match self.req("revoke", &zk, |c| c.set_data(&path, &data, Some(stat.version))).await {
                Ok(_) => return Ok(Some(before)),
                Err(ZkError::BadVersion) | Err(ZkError::NoNode) => continue,
                Err(e) => return Err(self.error("revoke", &e)),
            }
        }
        Err(StoreError::unavailable(format!(
            "zookeeper store {}: lock {lock:?} kept changing during revoke",
            self.shown
        )))
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_change(lock), max_wait).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        assert_eq!(
            t("zk://h"),
            Target { shown: "zk://h".into(), hosts: "h:2181".into(), user: None, root: DEFAULT_ROOT.into(), tls: None }
        );
        let two = t("zookeeper://u:p%40ss@a,b:2/team/x/");
        assert_eq!(two.hosts, "a:2181,b:2");
        assert_eq!(two.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(two.root, "/team/x");
        assert!(Target::parse("zk://h?tls=1").unwrap_err().contains("cacert=FILE"));
        assert!(Target::parse("zk://h?cacert=/ca.pem").unwrap_err().contains("need TLS"));
        assert!(Target::parse("zk://h?tls=1&cacert=/ca&cert=/c").unwrap_err().contains("go together"));
        let tls = t("zk://h?zookeeper.client.secure=true&cacert=/ca%20dir/ca.pem&cert=/c.pem&key=/k.pem");
        let files =
            TlsFiles { cacert: Some("/ca dir/ca.pem".into()), cert: Some("/c.pem".into()), key: Some("/k.pem".into()) };
        assert_eq!(tls.tls, Some(files));
        assert_eq!(t("zk://h?tls=false").hosts, "h:2181");
        assert!(Target::parse("zk://a,,b").is_err());
        assert!(Target::parse("zk://h/a//b").is_err());
        assert!(Target::parse("zk://h/a/../b").is_err());
        assert!(Target::parse("zk://h/zookeeper").is_err());
    }

    #[test]
    fn lock_names_round_trip() {
        let names = [
            "plain",
            "it's \"quoted\"",
            "ünïcødé 日本語",
            "a/b",
            "100% _",
            ".",
            "..",
            "...",
            ".hidden",
            "emoji 🦀",
            "del\u{7f}",
            "back\\slash",
            "trailing ",
        ];
        for name in names {
            let node = encode(name);
            assert!(!node.contains('/') && node != "." && node != "..", "{node:?}");
            assert!(!node.chars().any(refused_by_zookeeper), "{node:?}");
            assert_eq!(decode(&node).as_deref(), Some(name), "{node:?}");
        }
        assert_eq!(encode("a/b%c"), "a%2Fb%25c");
        assert_eq!(encode(".."), "%2E%2E");
        assert_ne!(encode("x"), encode("X"));
        assert_eq!(decode("a%2fb"), None, "only the encoder's own spelling decodes");
    }

    #[test]
    fn timeouts_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(300_001)), 301);
        assert_eq!(ceil_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(ceil_ms(Duration::ZERO), 1);
        assert_eq!(session_for(Duration::from_secs(15)), Duration::from_millis(18_750));
        assert_eq!(session_for(Duration::from_millis(1001)), Duration::from_millis(1252));
    }

    #[test]
    fn sequences() {
        assert_eq!(sequence("lease-0000000041"), Some(41));
        assert_eq!(sequence("other"), None);
        assert_eq!(sequence("lease-x"), None);
    }
}
