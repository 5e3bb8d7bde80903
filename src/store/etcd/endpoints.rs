//! Which etcd member a request goes to, and what happens when that member does not answer.
//!
//! One tonic channel per member (one HTTP/2 connection each, opened on first use), and a
//! small health record per member. tonic's balanced channel, used before, kept handing
//! requests to a member it could not connect to, and a request sent beside a hanging one
//! went over the same connection to the same member: with one member of three down, three
//! to seven one-shot runs in ten failed, and a frozen member cost a holder its lease.
//!
//! The rules, after etcd's own Go client (which avoids an endpoint that failed for a while
//! and sends a request again on another endpoint when that is safe), plus the copy a frozen
//! member calls for:
//! - A request goes to the first member in URL order that is neither marked down nor busy
//!   with another request of this store; a busy one comes next, a down one last (soonest back
//!   first). So a request sent while another still hangs (the elector's second renewal)
//!   goes to another member over another connection.
//! - A member that fails to connect, resets the connection, or leaves a request unanswered
//!   for `HEDGE_AFTER` is marked down for a backoff (0.5 s, doubling to 8 s) and tried again
//!   after it: a member that comes back is used again, without a probe of its own.
//! - A request that could not reach its member, or that etcd answered as unavailable (no
//!   leader, a proposal dropped by an election), is sent at once to the next member; one
//!   unanswered for `HEDGE_AFTER` gets a copy on the next member beside it. The first
//!   answer counts; the caller's own timeout bounds the whole. Every call the store makes
//!   may be sent twice (see `Connection`'s methods and the store's requests for why each is
//!   safe).
//!
//! Why each request of the store is safe to send twice: reads, and the renewal's check, are
//! reads; a keep-alive resets a lease to its granted TTL whenever it lands; a revoke of a
//! revoked lease is "not found", taken as done; the acquire's transaction compares
//! `create_revision == 0`, so a second copy finds the key the first wrote on the same etcd
//! lease, as it stands then: the store judges it as a renewal's read would (a `leaderrun
//! release` that landed between the two copies marked it revoked: not to be used); the
//! guarded writes (release, revoke, --min-hold) compare the key's mod revision and read the
//! key when the compare fails, so a second copy fails and shows what the first did (the
//! --min-hold re-put finds the key on its keep's new lease: done, and that lease is kept;
//! otherwise the store reads again); a queue entry's put rewrites the same empty value on the same
//! lease; a lease granted twice leaves one unused, which lapses by itself at its TTL (no key
//! is attached to it); an authentication answers a new token each time. A copy that lands
//! late (a proposal committed after the election) meets the same compares.
//!
//! A SIGSTOPped member keeps its connections open and answers nothing, and a member that is
//! merely waiting for an election looks the same for a second: both get the hedge; HTTP/2
//! pings would tell them apart, but etcd refuses pings more often than every 5 s.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{sleep_until, Instant};
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// An attempt unanswered this long gets a copy on the next member. etcd answers in
/// milliseconds; a leader election holds requests up for 0.5-2 s at its default settings.
pub const HEDGE_AFTER: Duration = Duration::from_secs(1);
/// How long a call goes on sending copies when etcd answers that it cannot serve now (no
/// leader, a proposal lost in an election): an election takes 0.5-2.3 s at etcd's defaults.
const GIVE_UP_AFTER: Duration = Duration::from_secs(3);
/// How long a member that failed is avoided at first; doubled at each failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// The members of one cluster, as the URL lists them.
pub struct Endpoints {
    members: Vec<Member>,
}

struct Member {
    channel: Channel,
    /// Attempts of this store sent to it and not answered yet.
    outstanding: AtomicUsize,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// Avoided until then (after a failure).
    down_until: Option<Instant>,
    /// The next failure's avoidance.
    backoff: Duration,
}

impl Member {
    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// It answered: use it again as first choice.
    fn answered(&self) {
        *self.health() = Health::default();
    }

    /// It could not be reached or did not answer in time: avoid it for a while.
    fn failed(&self) {
        let mut health = self.health();
        let backoff = health.backoff.clamp(FIRST_BACKOFF, MAX_BACKOFF);
        health.down_until = Some(Instant::now() + backoff);
        health.backoff = backoff * 2;
    }

    /// Its place in the order: idle and up first, busy next, then down (soonest back first).
    fn rank(&self, now: Instant) -> (u8, Option<Instant>) {
        match self.health().down_until.filter(|until| *until > now) {
            Some(until) => (2, Some(until)),
            None if self.outstanding.load(Ordering::SeqCst) == 0 => (0, None),
            None => (1, None),
        }
    }
}

/// An attempt under way on a member (counted while it lives, dropped or not).
struct Outstanding<'a>(&'a Member);

impl<'a> Outstanding<'a> {
    fn new(member: &'a Member) -> Self {
        member.outstanding.fetch_add(1, Ordering::SeqCst);
        Self(member)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Endpoints {
    /// One channel per endpoint; nothing connects until a request goes to it. Must be called
    /// within the tokio runtime (each channel starts a task).
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        let members = endpoints
            .into_iter()
            .map(|endpoint| Member {
                channel: endpoint.connect_lazy(),
                outstanding: AtomicUsize::new(0),
                health: Mutex::new(Health::default()),
            })
            .collect();
        Self { members }
    }

    /// The members in the order this request tries them.
    fn order(&self) -> Vec<usize> {
        let now = Instant::now();
        let mut ranked: Vec<_> = self.members.iter().enumerate().map(|(i, m)| (m.rank(now), i)).collect();
        ranked.sort();
        ranked.into_iter().map(|(_, i)| i).collect()
    }

    /// Run `attempt` on the first member in order; on the next one when it cannot reach its
    /// member or etcd answers it as unavailable, or beside it when it goes unanswered for
    /// `HEDGE_AFTER`. While attempts hang, a copy goes out every `HEDGE_AFTER`, round the
    /// members again (bar those that refused): a request a member forwarded to a leader that
    /// just died is lost, and etcd gives up on it only after 7 s, when a copy sent after the
    /// election is answered at once. The first answer (success or etcd's refusal) is returned;
    /// once every member failed and none is left hanging, the last failure. The caller's
    /// timeout bounds the whole. `attempt` must be safe to run more than once.
    pub async fn call<T, F, Fut>(&self, attempt: F) -> Result<T, Status>
    where
        F: Fn(Grpc<Channel>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let start = |i: usize| {
            let member = &self.members[i];
            let outstanding = Outstanding::new(member);
            let answer = attempt(Grpc::new(member.channel.clone()));
            async move {
                let answer = answer.await;
                drop(outstanding);
                (i, answer)
            }
        };
        let order = self.order();
        let mut sent = Sent { order, count: 0, refused: vec![false; self.members.len()] };
        let mut running = FuturesUnordered::new();
        let mut newest = sent.next().expect("a URL lists at least one endpoint");
        running.push(start(newest));
        let (called, mut last) = (Instant::now(), None);
        let mut hedge_at = called + HEDGE_AFTER;
        loop {
            tokio::select! {
                Some((i, answer)) = running.next() => match answer {
                    Err(status) if try_elsewhere(&status) => {
                        if unreachable(&status) {
                            self.members[i].failed();
                            sent.refused[i] = true;
                        }
                        match sent.next_in_first_round() {
                            Some(j) => {
                                running.push(start(j));
                                (newest, hedge_at) = (j, Instant::now() + HEDGE_AFTER);
                            }
                            None if running.is_empty() && (sent.all_refused() || sent.order.len() == 1 || called.elapsed() >= GIVE_UP_AFTER) => {
                                return Err(status)
                            }
                            // Sent again at the hedge's pace: etcd said "not now" (an election).
                            None => last = Some(status),
                        }
                    }
                    answer => {
                        self.members[i].answered();
                        return answer;
                    }
                },
                // One member: a copy on the same connection would only add to its load (a
                // request lost in an election needs another member to have led).
                () = sleep_until(hedge_at), if self.members.len() > 1 => {
                    if !running.is_empty() {
                        self.members[newest].failed();
                    } else if called.elapsed() >= GIVE_UP_AFTER {
                        return Err(last.unwrap_or_else(|| Status::unavailable("no member answered")));
                    }
                    match sent.next() {
                        Some(j) => {
                            running.push(start(j));
                            (newest, hedge_at) = (j, Instant::now() + HEDGE_AFTER);
                        }
                        None if running.is_empty() => {
                            return Err(last.unwrap_or_else(|| Status::unavailable("no member answered")))
                        }
                        // Every member refused but those still hanging: wait for them.
                        None => hedge_at += Duration::from_secs(3600),
                    }
                }
            }
        }
    }
}

/// Which member a call sends its next attempt to: the call's order, round and round, bar the
/// members it could not reach.
struct Sent {
    order: Vec<usize>,
    /// Attempts started.
    count: usize,
    /// Members this call could not reach.
    refused: Vec<bool>,
}

impl Sent {
    fn next(&mut self) -> Option<usize> {
        let n = self.order.len();
        let skip = (0..n).find(|k| !self.refused[self.order[(self.count + k) % n]])?;
        self.count += skip + 1;
        Some(self.order[(self.count - 1) % n])
    }

    fn all_refused(&self) -> bool {
        self.refused.iter().all(|r| *r)
    }

    /// The next member not tried yet by this call, if any (a failure moves on at once only
    /// that far: later rounds go at the hedge's pace).
    fn next_in_first_round(&mut self) -> Option<usize> {
        (self.count < self.order.len()).then(|| self.next()).flatten()
    }
}

/// The request did not reach its member, or the connection broke under it (tonic attaches the
/// transport error as the source); an answer from etcd itself has none.
fn unreachable(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// Worth sending to another member: it could not be reached, or etcd answered that it cannot
/// serve now (no leader, an election under way, overloaded). Any other answer is etcd's word
/// on the request and would be the same elsewhere.
fn try_elsewhere(status: &Status) -> bool {
    unreachable(status)
        || matches!(
            status.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize) -> Endpoints {
        Endpoints::new((0..n).map(|i| Endpoint::from_shared(format!("http://127.0.0.1:{}", 1 + i)).unwrap()).collect())
    }

    #[tokio::test]
    async fn busy_then_down_members_go_last() {
        let e = endpoints(3);
        assert_eq!(e.order(), [0, 1, 2], "URL order");
        let busy = Outstanding::new(&e.members[0]);
        assert_eq!(e.order(), [1, 2, 0], "a request beside a hanging one goes elsewhere");
        e.members[1].failed();
        assert_eq!(e.order(), [2, 0, 1]);
        drop(busy);
        assert_eq!(e.order(), [0, 2, 1]);
        e.members[1].answered();
        assert_eq!(e.order(), [0, 1, 2], "a member that answers is first choice again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_member_is_avoided_longer_each_time() {
        let e = endpoints(2);
        e.members[0].failed();
        tokio::time::advance(FIRST_BACKOFF + Duration::from_millis(1)).await;
        assert_eq!(e.order(), [0, 1], "tried again after its backoff");
        e.members[0].failed();
        tokio::time::advance(FIRST_BACKOFF + Duration::from_millis(1)).await;
        assert_eq!(e.order(), [1, 0], "avoided twice as long after a second failure");
    }

    #[test]
    fn copies_go_round_the_members_that_did_not_refuse() {
        let mut sent = Sent { order: vec![2, 0, 1], count: 0, refused: vec![false; 3] };
        assert_eq!([sent.next(), sent.next_in_first_round()], [Some(2), Some(0)]);
        sent.refused[2] = true;
        assert_eq!(sent.next_in_first_round(), Some(1));
        assert_eq!(sent.next_in_first_round(), None, "the first round is over");
        assert_eq!([sent.next(), sent.next(), sent.next()], [Some(0), Some(1), Some(0)]);
        sent.refused = vec![true; 3];
        assert_eq!(sent.next(), None);
    }
}
