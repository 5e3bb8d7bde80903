//! The NATS store on a 3-server cluster with a bucket replicated three ways (`?replicas=3`),
//! as users run it: a lost race is a lost race there too (a replicated stream refuses a stale
//! compare-and-set with another error code than a single server does), a run on a bucket
//! just made waits until its stream has been placed, the conformance suite holds on the
//! cluster, and with one server killed or frozen a holder keeps its lease and one-shot runs
//! succeed (`cluster_nats_faults.rs`).

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{unique, Harness};
use leaderrun::store::{registry, Access};
use leaderrun::store::{Acquire, Store};
use servers::cluster::Cluster;
use servers::nats_cluster::NatsCluster;

async fn store(url: &str) -> Arc<dyn Store> {
    registry::parse_url(url).expect("a valid URL").open(Access::Create).await.map(Arc::from).expect("open")
}

/// Contenders racing for a free lock on a replicated bucket: one wins, every other is told the
/// lock is held. None may get an error: a `--wait` contender would exit 69 on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_contenders_on_a_replicated_bucket_lose_as_a_conflict_not_an_error() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start).await.unwrap();
    let url = format!("{}/{}?replicas=3", cluster.url(), unique("race").replace('-', "_"));
    let mut stores = Vec::new();
    for _ in 0..10 {
        stores.push(store(&url).await);
    }
    for round in 0..10 {
        let lock = format!("round-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, lock, barrier) = (store.clone(), lock.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.acquire(&lock, &format!("c{i}"), conformance::TTL).await
                })
            })
            .collect();
        let mut won = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(Acquire::Won(_)) => won += 1,
                Ok(Acquire::Held(_)) => {}
                other => panic!("round {round}: a lost race must be a conflict: {other:?}"),
            }
        }
        assert_eq!(won, 1, "round {round}: exactly one winner");
    }
}

/// A run on a replicated bucket that does not exist yet makes it and acquires at once, and a
/// run on another server right after it does too: each waits until the stream takes messages
/// (its servers learn of a new stream a moment after it is made) instead of failing with "no
/// stream found".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_runs_on_a_new_replicated_bucket_wait_for_its_stream() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start).await.unwrap();
    for round in 0..10 {
        let bucket = unique(&format!("new{round}")).replace('-', "_");
        for (node, lock) in [(0, "first"), (2, "second")] {
            let store = store(&format!("{}/{bucket}?replicas=3", cluster.url_of(node))).await;
            match store.acquire(lock, "a", conformance::TTL).await {
                Ok(Acquire::Won(_)) => {}
                other => panic!("round {round}: {lock} acquire on a new bucket (server {node}): {other:?}"),
            }
        }
    }
}

/// The cluster as the conformance suite sees it: every client on the URL of all three servers,
/// a bucket replicated three ways; a restart is the SIGKILL of the bucket stream's leader and
/// its start again, once another leads the stream.
struct Replicated {
    cluster: NatsCluster,
    bucket: String,
}

#[async_trait]
impl Harness for Replicated {
    async fn open(&self) -> Arc<dyn Store> {
        store(&format!("{}/{}?replicas=3", self.cluster.url(), self.bucket)).await
    }

    async fn restart(&self) {
        tokio::task::block_in_place(|| {
            let stream = format!("KV_{}", self.bucket);
            let leader = self.cluster.wait_for_stream_leader(&stream, None, Duration::from_secs(30));
            let leader = leader.expect("the bucket's stream has a leader");
            self.cluster.kill(leader);
            let next = self.cluster.wait_for_stream_leader(&stream, Some(leader), Duration::from_secs(60));
            assert!(next.is_some(), "the stream elects another leader");
            self.cluster.restart(leader);
        })
    }
}

/// The conformance suite, whole, on one cluster (one cluster for all, run one after another:
/// a cluster per check would cost more than the checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conformance_suite_holds_on_a_replicated_bucket() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start).await.unwrap();
    let h = Replicated { cluster, bucket: unique("suite").replace('-', "_") };
    conformance::the_core_and_expiry(&h).await;
    conformance::leases_survive_a_restart(&h).await;
}

/// Two renewals of one lease sent at once (the elector's hedged second renewal, each over its
/// own connection): the one whose compare-and-set finds the other's write reads the entry,
/// knows it for its own and renews it. Neither may report the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_renewals_of_one_lease_at_once_both_renew() {
    use leaderrun::store::Renew;
    let cluster = tokio::task::spawn_blocking(NatsCluster::start).await.unwrap();
    let url = format!("{}/{}?replicas=3", cluster.url(), unique("hedge").replace('-', "_"));
    let holder = store(&url).await;
    let lease = conformance::won(&*holder, "hedged", "a", conformance::TTL).await;
    // Time for the second connection to open, so that the two go over different ones.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for round in 0..20 {
        let (one, two) = tokio::join!(holder.renew(&lease, conformance::TTL), holder.renew(&lease, conformance::TTL));
        assert_eq!((one.unwrap(), two.unwrap()), (Renew::Renewed, Renew::Renewed), "round {round}");
    }
    let other = store(&url).await;
    let status = other.status("hedged").await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("a"), lease.token));
}
