//! Two connections to the cluster, each to another server, and requests sent over the one
//! that answers.
//!
//! async-nats keeps one connection at a time from its server pool, and moves to another
//! server only once it notices the first is gone: at once when the server closes it (a
//! killed server), but only after unanswered pings when the server is frozen (SIGSTOP) or
//! its host vanished, and meanwhile every request over it hangs. So a store keeps two:
//! - `first`, to the first server of the URL that answers (the URL's order, kept on
//!   reconnects: a server refusing connections costs a refused dial, nothing more);
//! - `second`, opened in the background once a run opens the store, to the URL's servers
//!   in another order (rotated by one; a URL of one server puts the servers that server
//!   told of first), so that it is on another server while the first is.
//!
//! A request goes over the link that is not suspect (see `Link::suspect`) and has the fewest
//! requests in flight: the elector's hedged second renewal, sent while the first is still
//! unanswered, thus goes to another server over another connection. A request unanswered
//! after `ATTEMPT_TIMEOUT` is sent again over the other link (the first attempt still
//! counts if it answers first), and one refused for a reason that passes (no stream leader
//! during an election: "no responders", a timeout) is sent again after `RETRY_PAUSE`, until
//! `REQUEST_TIMEOUT` runs out.
//!
//! A waiter's watch and queue subscription stay on `first`: when it moves to another server,
//! async-nats subscribes again there and recreates the watch's ordered consumer (also after
//! 5 s without its heartbeats: a consumer lost with a stream leader), from the last sequence
//! it delivered, so a watch does not stall when its server dies.
//!
//! Sending a write again is safe: every write is a compare-and-set publish
//! (`Nats-Expected-Last-Subject-Sequence`). If an earlier copy landed, the later one is
//! refused as a lost race, and the caller reads the key and judges what it finds: a renewal
//! finds its own entry (same token and identity, not revoked) and renews it; an acquire
//! recognises the entry it wrote itself (same identity and acquired time, no token header
//! yet); a release finds the delete marker. A copy held up in a frozen server and
//! delivered after it thaws names a message that is no longer the key's last: refused.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{Client, ConnectOptions};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use tokio::time::{sleep_until, timeout, Instant};

use super::target::{Auth, Target};
use super::{describe, NatsStore, REQUEST_TIMEOUT};
use crate::store::{Result, StoreError};

/// Time to open a connection (a frozen server accepts the TCP connection and then says
/// nothing: it is given up after this long and the next server dialled).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the client pings its server when nothing else came from it. async-nats closes
/// the connection when a third ping is due with two unanswered, and dials another server: a
/// frozen server is noticed 2 intervals after it last answered (2.0 s measured, 5 of 5), a
/// small part of any lease (and what a waiter's watch on it loses). One ping and pong a
/// second per connection is nothing to a server.
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// A request unanswered this long is sent again over the other link. A JetStream publish
/// or read of one key takes milliseconds; this is for a server that stopped answering, and
/// short enough for the attempt over the other link to fit in the elector's renewal budget
/// (2.3 s before the hedge at the default ttl).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Pause before sending again a request refused for a reason that passes (a stream whose
/// leader is being elected answers "no responders" at once).
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// One connection and what is known of its health.
pub(super) struct Link {
    pub js: jetstream::Context,
    /// Requests in flight over it.
    busy: AtomicUsize,
    /// Set when a request over it went unanswered for `ATTEMPT_TIMEOUT` or its connection
    /// dropped; cleared by an answer over it or a new connection: other requests go to the
    /// other link meanwhile.
    suspect: Arc<AtomicBool>,
}

impl Link {
    fn new(client: Client, suspect: Arc<AtomicBool>) -> Self {
        let mut js = jetstream::new(client);
        js.set_timeout(REQUEST_TIMEOUT);
        Self { js, busy: AtomicUsize::new(0), suspect }
    }

    /// Where it is connected, for logs.
    fn server(&self) -> String {
        let info = self.js.client().server_info();
        format!("{}:{}", info.host, info.port)
    }
}

/// Both links; the second once it is connected.
pub(super) struct Links {
    pub first: Link,
    second: Arc<OnceLock<Link>>,
}

/// Marks one attempt in flight over a link, until dropped.
struct Busy<'a>(&'a Link);

impl<'a> Busy<'a> {
    fn enter(link: &'a Link) -> Self {
        link.busy.fetch_add(1, Ordering::SeqCst);
        Self(link)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Links {
    /// The links to try, best first: not suspect, fewest requests in flight, not the one
    /// `avoid` (just refused), the first before the second.
    fn pick(&self, avoid: Option<usize>) -> (usize, &Link) {
        let links = [Some(&self.first), self.second.get()];
        let rank = |(i, link): &(usize, &Link)| {
            (link.suspect.load(Ordering::SeqCst), link.busy.load(Ordering::SeqCst), avoid == Some(*i), *i)
        };
        links.into_iter().enumerate().filter_map(|(i, l)| l.map(|l| (i, l))).min_by_key(rank).expect("a first link")
    }
}

/// Options for one connection to the servers in `servers`, in that order: `suspect` follows
/// its connection's state.
async fn options(target: &Target, suspect: Arc<AtomicBool>) -> Result<ConnectOptions> {
    let shown = &target.shown;
    let mut options = ConnectOptions::new()
        .name("leaderrun")
        .connection_timeout(CONNECT_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .ping_interval(PING_INTERVAL)
        // The URL's order: a client's preferred server is the first listed that answers.
        .retain_servers_order()
        // The first attempt at once (async-nats counts from 1, and a delay there would be
        // added to every run's start), then 100 ms more per failed attempt, at most 2 s.
        .reconnect_delay_callback(|attempts| Duration::from_millis(100 * attempts.saturating_sub(1).min(20) as u64))
        .event_callback(move |event| {
            let suspect = suspect.clone();
            async move {
                match event {
                    async_nats::Event::Connected => suspect.store(false, Ordering::SeqCst),
                    async_nats::Event::Disconnected => suspect.store(true, Ordering::SeqCst),
                    // The server refuses a subscription it does not permit by an error of its
                    // own, after the fact; the waiter goes on without the queue group (`wait.rs`).
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                        if text.to_ascii_lowercase().contains("permissions violation for subscription") =>
                    {
                        tracing::warn!("waiting without the queue group (each release costs a stagger): {text}");
                    }
                    _ => {}
                }
            }
        });
    match &target.auth {
        Auth::None => {}
        Auth::User(user, pass) => options = options.user_and_password(user.clone(), pass.clone()),
        Auth::Token(token) => options = options.token(token.clone()),
    }
    if let Some(creds) = &target.creds {
        options = options
            .credentials_file(creds)
            .await
            .map_err(|e| StoreError::refused(format!("nats store {shown}: cannot read {}: {e}", creds.display())))?;
    }
    if target.tls {
        options = options.require_tls(true);
    }
    if let Some(ca) = &target.tls_ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&target.tls_cert, &target.tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// The first link: connected to the first of the URL's servers that answers, or the error.
pub(super) async fn connect_first(target: &Target) -> Result<Links> {
    let shown = &target.shown;
    let suspect = Arc::new(AtomicBool::new(false));
    let options = options(target, suspect.clone()).await?;
    tracing::trace!(op = "connect", "store request");
    // async-nats logs a failed login at ERROR level itself; logging.rs keeps other crates' events
    // out below -vvv, and this store's error says it in one line.
    let client = match timeout(REQUEST_TIMEOUT, options.connect(target.servers.clone())).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => {
            use async_nats::ConnectErrorKind as K;
            let why = describe(&e);
            let message = format!("nats store {shown}: {why}");
            // A TLS failure (an untrusted certificate, TLS against a plain server) comes as
            // an I/O error, but retrying will not fix it.
            let tls = ["certificate", "corrupt message", "tls"].iter().any(|w| why.to_lowercase().contains(w));
            return Err(match e.kind() {
                K::Io if tls => StoreError::refused(message),
                K::Io | K::TimedOut | K::Dns | K::MaxReconnects => StoreError::unavailable(message),
                K::ServerParse | K::Authentication | K::AuthorizationViolation | K::Tls => StoreError::refused(message),
            });
        }
        Err(_) => {
            return Err(StoreError::unavailable(format!(
                "nats store {shown}: no answer within {}s",
                REQUEST_TIMEOUT.as_secs()
            )))
        }
    };
    Ok(Links { first: Link::new(client, suspect), second: Arc::new(OnceLock::new()) })
}

/// The second link's servers: the URL's rotated by one, or, for a URL of one server, the
/// servers it told of first (`connect_urls`), then it.
fn second_servers(target: &Target, first: &Client) -> Vec<String> {
    let mut servers = target.servers.clone();
    if servers.len() > 1 {
        servers.rotate_left(1);
        return servers;
    }
    let told = first.server_info().connect_urls;
    let mut others: Vec<String> =
        told.iter().map(|url| format!("nats://{}", url.trim_start_matches("nats://"))).collect();
    others.retain(|url| !servers.contains(url));
    others.extend(servers);
    others
}

impl Links {
    /// Open the second link in the background: nothing waits for it, and requests use the
    /// first alone until it is up (a run's renewals come seconds after its acquire).
    pub(super) fn open_second(&self, target: &Target) {
        let (target, slot) = (target.clone(), self.second.clone());
        let servers = second_servers(&target, &self.first.js.client());
        tokio::spawn(async move {
            let suspect = Arc::new(AtomicBool::new(false));
            let Ok(options) = options(&target, suspect.clone()).await else { return };
            match timeout(REQUEST_TIMEOUT * 2, options.connect(servers)).await {
                Ok(Ok(client)) => {
                    let link = Link::new(client, suspect);
                    tracing::debug!(server = %link.server(), "second connection to the cluster");
                    let _ = slot.set(link);
                }
                Ok(Err(e)) => tracing::debug!("no second connection to the cluster: {}", describe(&e)),
                Err(_) => tracing::debug!("no second connection to the cluster: no answer"),
            }
        });
    }
}

/// Whether a request's error passes if sent again: no stream leader answers (an election;
/// "no responders"), or no answer came, or the connection is being replaced.
pub(super) fn passes(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let again = [
        "no responders",
        "no stream found",
        "timed out",
        "broken pipe",
        "not connected",
        "disconnected",
        "temporarily unavailable",
        "(code 503",
        "leader not",
        "no leader",
    ];
    again.iter().any(|needle| lower.contains(needle))
}

impl NatsStore {
    /// One request over the links (see the module's doc): `attempt` sends it over the
    /// connection given and says `Err(why)` when it should be sent again, else its answer
    /// (which may be a final error). `Err(None)` when no attempt was answered within
    /// `REQUEST_TIMEOUT`, `Err(Some(why))` when the last was refused.
    pub(super) async fn over_links<T, F, Fut>(
        &self,
        op: &'static str,
        attempt: F,
    ) -> std::result::Result<T, Option<String>>
    where
        F: Fn(jetstream::Context) -> Fut,
        Fut: Future<Output = std::result::Result<T, String>>,
    {
        let until = Instant::now() + REQUEST_TIMEOUT;
        let mut attempts = FuturesUnordered::new();
        // `unanswered`: the link of the latest attempt, while it is unanswered.
        let (mut next, mut last, mut avoid, mut unanswered) = (Instant::now(), None, None, None);
        loop {
            let now = Instant::now();
            if now >= until {
                return Err(last);
            }
            if now >= next {
                if let Some(i) = unanswered {
                    // The last attempt went unanswered: its link is suspect until it answers.
                    let link: Option<&Link> = if i == 0 { Some(&self.links.first) } else { self.links.second.get() };
                    if let Some(link) = link {
                        tracing::debug!(op, server = %link.server(), "no answer yet; sending again over the other connection");
                        link.suspect.store(true, Ordering::SeqCst);
                    }
                }
                let (i, link) = self.links.pick(avoid);
                tracing::trace!(op, "store request");
                let busy = Busy::enter(link);
                let sent = attempt(link.js.clone());
                attempts.push(async move { (i, busy, sent.await) });
                (next, avoid, unanswered) = (now + ATTEMPT_TIMEOUT, Some(i), Some(i));
            }
            tokio::select! {
                Some((i, busy, answer)) = attempts.next() => match answer {
                    Ok(value) => {
                        busy.0.suspect.store(false, Ordering::SeqCst);
                        return Ok(value);
                    }
                    Err(why) => {
                        tracing::debug!(op, "sending again: {why}");
                        if unanswered == Some(i) {
                            unanswered = None;
                        }
                        (next, avoid) = (next.min(Instant::now() + RETRY_PAUSE), Some(i));
                        last = Some(why);
                    }
                },
                () = sleep_until(next.min(until)) => {}
            }
        }
    }
}
