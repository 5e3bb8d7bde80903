//! Semaphores (`--slots N`, DESIGN.md §9): N locks under one name, built once above the
//! store trait so that every store has them.
//!
//! Slot `i` of lock `L` is a lock record of its own: slot 0 is `L` itself (so `--slots 1`
//! is a plain lock, and a plain lock is slot 0 of any semaphore of that name), and slot
//! `i > 0` is `L` + U+001F (the ASCII unit separator) + `i`. A lock name may not contain a
//! control character (`validate_lock_name`), so no slot record is ever another lock's.
//! Each slot keeps the whole contract of a lock: one holder, its own fencing token,
//! strictly increasing, and the same timing rule. So at most one child per slot runs.
//!
//! Runs that name the same lock with different `--slots` share the slots by number: a run
//! with `--slots N` only ever takes slots `0..N`. However the counts differ, no more children
//! run than the largest `--slots` in use, and a run never starts a child in a slot above its
//! own count. Lowering the count takes effect as the runs in the higher slots end; raising it
//! takes effect at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{Acquire, Lease, LockRecord, Observing, Renew, Result, Store, MAX_LOCK_NAME};

/// Most slots a lock may have: each waiting run campaigns for every slot, over a connection
/// of its own.
pub const MAX_SLOTS: usize = 100;

/// Between a lock's name and its slot number in a slot's record name.
const SEPARATOR: char = '\u{1f}';

/// The record name of slot `slot` of `lock`.
pub fn record_name(lock: &str, slot: usize) -> String {
    if slot == 0 {
        lock.to_string()
    } else {
        format!("{lock}{SEPARATOR}{slot}")
    }
}

/// The lock and slot a record name stands for (a plain lock's record is its slot 0). Only
/// the canonical spelling of a slot number counts: `L␟01` is nobody's slot.
pub fn parse(name: &str) -> (&str, usize) {
    if let Some((lock, number)) = name.rsplit_once(SEPARATOR) {
        if let Ok(slot) = number.parse::<usize>() {
            if slot > 0 && slot.to_string() == number && !lock.contains(SEPARATOR) {
                return (lock, slot);
            }
        }
    }
    (name, 0)
}

/// Check `--slots` against the lock's name: 1 to `MAX_SLOTS`, and room for the slot number
/// within the longest name a store is asked to keep.
pub fn validate(lock: &str, slots: usize) -> std::result::Result<(), String> {
    if slots == 0 || slots > MAX_SLOTS {
        return Err(format!("--slots must be from 1 to {MAX_SLOTS}, not {slots}"));
    }
    let longest = MAX_LOCK_NAME - 1 - (MAX_SLOTS - 1).to_string().len();
    if slots > 1 && lock.chars().count() > longest {
        return Err(format!(
            "--lock is {} characters long; with --slots the maximum is {longest} (each slot's record adds its number)",
            lock.chars().count()
        ));
    }
    Ok(())
}

/// One slot of a lock as a store of its own: the elector and the subcommands name the lock,
/// and this turns it into the slot's record, and the record's name back into the lock's in
/// what the store answers. Every call goes to the slot's record and nowhere else.
pub struct SlotStore {
    inner: Arc<dyn Store>,
    slot: usize,
}

impl SlotStore {
    pub fn new(inner: Arc<dyn Store>, slot: usize) -> Self {
        Self { inner, slot }
    }

    fn name(&self, lock: &str) -> String {
        record_name(lock, self.slot)
    }

    fn lease(&self, lease: &Lease) -> Lease {
        Lease { lock: self.name(&lease.lock), ..lease.clone() }
    }
}

/// `record` with the lock's name in place of the slot's record name.
fn named(lock: &str, mut record: LockRecord) -> LockRecord {
    record.lock = lock.to_string();
    record
}

#[async_trait]
impl Store for SlotStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        Ok(match self.inner.acquire(&self.name(lock), identity, ttl).await? {
            Acquire::Won(lease) => Acquire::Won(Lease { lock: lock.to_string(), ..lease }),
            Acquire::Confirm { lease, after } => {
                Acquire::Confirm { lease: Lease { lock: lock.to_string(), ..lease }, after }
            }
            Acquire::Held(record) => Acquire::Held(named(lock, record)),
            Acquire::Unproven { record, decide_in } => Acquire::Unproven { record: named(lock, record), decide_in },
        })
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        Ok(match self.inner.renew(&self.lease(lease), ttl).await? {
            Renew::Renewed => Renew::Renewed,
            Renew::Lost(record) => Renew::Lost(record.map(|r| named(&lease.lock, r))),
        })
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        self.inner.release(&self.lease(lease), keep).await
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        Ok(named(lock, self.inner.status(&self.name(lock)).await?))
    }

    /// Every record, as the store names them (`parse` tells the slots apart).
    async fn list(&self) -> Result<Vec<LockRecord>> {
        self.inner.list().await
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        Ok(self.inner.revoke(&self.name(lock)).await?.map(|r| named(lock, r)))
    }

    async fn abandon(&self, lock: &str, identity: &str) -> Result<()> {
        self.inner.abandon(&self.name(lock), identity).await
    }

    async fn longest_ttl(&self, wanted: Duration) -> Result<Option<Duration>> {
        self.inner.longest_ttl(wanted).await
    }

    async fn failover(&self) -> Result<Option<Duration>> {
        self.inner.failover().await
    }

    async fn longest_keep(&self) -> Result<Option<Duration>> {
        self.inner.longest_keep().await
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        self.inner.changed(&self.name(lock), max_wait).await
    }

    async fn stop_waiting(&self, lock: &str) {
        self.inner.stop_waiting(&self.name(lock)).await
    }

    fn sees_expiry(&self) -> bool {
        self.inner.sees_expiry()
    }

    fn observing(&self) -> Observing {
        self.inner.observing()
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        self.inner.observe_change(&self.name(lock), max_wait).await
    }
}

/// The records of `lock`'s slots, for `status` and `release`: exactly `count` of them if it
/// is given, else slot 0 and each further slot up to the first the store has never seen (a
/// run takes the lowest free slot first, so a semaphore's slots are used from 0 up).
pub async fn read(store: &Arc<dyn Store>, lock: &str, count: Option<usize>) -> Result<Vec<LockRecord>> {
    let mut records = Vec::new();
    for slot in 0..count.unwrap_or(MAX_SLOTS) {
        let record = SlotStore::new(store.clone(), slot).status(lock).await?;
        let never_used = !record.is_held() && record.token == 0;
        if count.is_none() && slot > 0 && never_used {
            break;
        }
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_records_never_collide_with_a_lock_name() {
        assert_eq!(record_name("billing", 0), "billing");
        assert_eq!(record_name("billing", 2), "billing\u{1f}2");
        assert!(crate::store::validate_lock_name(&record_name("billing", 2)).is_err());
        for slot in [0, 1, 9, 10, 99] {
            assert_eq!(parse(&record_name("a b", slot)), ("a b", slot));
        }
        assert_eq!(parse("billing"), ("billing", 0));
        assert_eq!(parse("billing\u{1f}01"), ("billing\u{1f}01", 0), "only the canonical number");
        assert_eq!(parse("billing\u{1f}0"), ("billing\u{1f}0", 0));
        assert_eq!(parse("billing\u{1f}x"), ("billing\u{1f}x", 0));
    }

    #[test]
    fn counts_and_names_are_checked() {
        assert!(validate("x", 1).is_ok());
        assert!(validate("x", MAX_SLOTS).is_ok());
        assert!(validate("x", 0).unwrap_err().contains("--slots must be from 1"));
        assert!(validate("x", MAX_SLOTS + 1).unwrap_err().contains("--slots must be from 1"));
        assert!(validate(&"x".repeat(255), 1).is_ok(), "a plain lock keeps the whole length");
        assert!(validate(&"x".repeat(252), 3).is_ok());
        assert!(validate(&"x".repeat(253), 3).unwrap_err().contains("maximum is 252"));
    }
}
