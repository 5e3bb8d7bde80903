//! The NATS store on a 3-server cluster with a bucket replicated three ways (`?replicas=3`),
//! as users run it: a lost race is a lost race there too (a replicated stream refuses a stale
//! compare-and-set with another error code than a single server does), and a run on a bucket
//! just made waits until its stream has been placed.

mod conformance;
mod servers;

use std::sync::Arc;

use conformance::unique;
use leaderrun::store::url::{open, Access, StoreSpec};
use leaderrun::store::{Acquire, Store};
use servers::nats_cluster::NatsCluster;

async fn store(url: &str) -> Arc<dyn Store> {
    open(&StoreSpec::from_url(url).expect("a valid URL"), Access::Create).await.map(Arc::from).expect("open")
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
