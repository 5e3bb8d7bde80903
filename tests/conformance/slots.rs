//! `--slots N` on every store: N locks under one name, each with its own holder and fencing
//! token, none of them another lock's record, each slot's release waking that slot's waiter.

use std::sync::Arc;
use std::time::Duration;

use leaderrun::slots::{self, SlotStore};
use leaderrun::store::{Acquire, Store};

use super::{held, unique, waiting, won, Harness, SOON, TTL};

fn slot(store: &Arc<dyn Store>, i: usize) -> Arc<dyn Store> {
    Arc::new(SlotStore::new(store.clone(), i))
}

pub async fn slots_are_locks_of_their_own(h: &dyn Harness) {
    let lock = unique("slots");
    let (a, b, c, d) = (h.open().await, h.open().await, h.open().await, h.open().await);
    let first: Vec<u64> = {
        let mut tokens = Vec::new();
        for (i, (store, who)) in [(&a, "a"), (&b, "b"), (&c, "c")].into_iter().enumerate() {
            let lease = won(&*slot(store, i), &lock, who, TTL).await;
            assert_eq!(lease.lock, lock, "a slot's lease is named by its lock");
            tokens.push(lease.token);
        }
        tokens
    };
    // Three slots, three holders; a fourth contender finds each held, by its own holder.
    for i in 0..3 {
        held(&*slot(&d, i), &lock, "d").await;
        let record = slot(&d, i).status(&lock).await.unwrap();
        assert_eq!((record.lock.as_str(), record.holder.as_deref()), (lock.as_str(), Some(["a", "b", "c"][i])));
    }
    // Slot 0 is the lock itself; the others are records no lock name can reach.
    assert_eq!(d.status(&lock).await.unwrap().holder.as_deref(), Some("a"));
    for other in [format!("{lock}1"), format!("{lock} 1"), format!("{lock}/1"), format!("{lock}#1")] {
        assert!(!d.status(&other).await.unwrap().is_held(), "{other:?} is another lock");
    }
    let listed: Vec<(String, usize)> = d
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.is_held())
        .map(|r| {
            let (name, i) = slots::parse(&r.lock);
            (name.to_string(), i)
        })
        .filter(|(name, _)| *name == lock)
        .collect();
    assert_eq!(listed.len(), 3, "list shows each slot's record: {listed:?}");
    let read = slots::read(&d, &lock, None).await.unwrap();
    assert_eq!(read.iter().filter(|r| r.is_held()).count(), 3, "status reads every slot: {read:?}");
    // Slot 1's release wakes slot 1's waiter, who gets a larger token in slot 1 only.
    let standby = slot(&d, 1);
    let waiter = waiting(&standby, &lock);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b_lease = slot(&b, 1).status(&lock).await.unwrap();
    let b_lease = leaderrun::store::Lease { lock: lock.clone(), identity: "b".into(), token: b_lease.token };
    slot(&b, 1).release(&b_lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, waiter).await.expect("slot 1's release never woke its waiter").unwrap();
    let lease = won(&*standby, &lock, "d", TTL).await;
    assert!(lease.token > first[1], "slot 1's token went from {} to {}", first[1], lease.token);
    for i in [0, 2] {
        assert_eq!(slot(&d, i).status(&lock).await.unwrap().holder.as_deref(), Some(["a", "b", "c"][i]));
    }
    // A revoke of one slot touches that slot alone.
    let before = slot(&d, 2).revoke(&lock).await.unwrap().expect("slot 2 was held");
    assert_eq!(before.holder.as_deref(), Some("c"));
    assert!(!slot(&a, 0).status(&lock).await.unwrap().revoked);
    assert!(matches!(slot(&a, 0).acquire(&lock, "e", TTL).await.unwrap(), Acquire::Held(_) | Acquire::Unproven { .. }));
}

/// A standby that stops waiting for a lock (its run won another slot) gives up its place among
/// the lock's standbys: the one behind it is woken by the next release, not held up by a place
/// that nobody will take, for as long as the store that kept it lives.
pub async fn a_standby_that_stops_waiting_holds_no_one_up(h: &dyn Harness) {
    let lock = unique("leave");
    let (a, b, c) = (h.open().await, h.open().await, h.open().await);
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    // b takes its place in line (a wait that ends at its bound keeps it), then c behind it.
    b.changed(&lock, Duration::from_millis(300)).await;
    held(&*c, &lock, "c").await;
    let waiter = waiting(&c, &lock);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.stop_waiting(&lock).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, waiter).await.expect("the standby behind one that left was never woken").unwrap();
    won(&*c, &lock, "c", TTL).await;
    drop(b);
}
