//! A lock's item: one per lock, its partition key `key` the lock name as it is, its
//! attributes named as awslabs' DynamoDB lock client names them where they mean the same
//! thing, so that a reader of that client recognises the record:
//!
//! | attribute | type | what |
//! |---|---|---|
//! | `key` | S | the lock name (the partition key) |
//! | `ownerName` | S | the holder's identity (`""` once released) |
//! | `leaseDuration` | S | the holder's lease in milliseconds, as the lock client writes it |
//! | `recordVersionNumber` | S | a random UUID, new at every write: the version writes are guarded by |
//! | `isReleased` | S | `"1"` once released, absent while held (the lock client's marker) |
//! | `leaderrun` | N | the layout of leaderrun's own attributes below (1) |
//! | `fencingToken` | N | leaderrun's fencing token |
//! | `leaseTransitions` | N | how many times the holder changed |
//! | `acquiredAtMs`, `renewedAtMs` | N | when the holder took and last renewed it, on its wall clock (display only) |
//! | `revoked` | BOOL | `leaderrun release` asked the holder to stand down |
//! | `keptUntilMs` | N | released with a --min-hold keep: taken until DynamoDB's clock reads this |
//!
//! A random version (not a counter) never repeats, even after the item is deleted and made
//! again: a standby that saw one version can never mistake a new item for the old one. An
//! item the lock client wrote (no `leaderrun` attribute) reads as a lease of `leaseDuration`
//! held by `ownerName` with no token; its `data` is left alone until leaderrun takes it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;

use crate::store::client_timed::Record;

pub const KEY: &str = "key";
pub const OWNER: &str = "ownerName";
pub const LEASE_DURATION: &str = "leaseDuration";
pub const VERSION: &str = "recordVersionNumber";
pub const RELEASED: &str = "isReleased";
const LAYOUT: &str = "leaderrun";
const TOKEN: &str = "fencingToken";
const TRANSITIONS: &str = "leaseTransitions";
const ACQUIRED: &str = "acquiredAtMs";
const RENEWED: &str = "renewedAtMs";
const REVOKED: &str = "revoked";
const KEPT_UNTIL: &str = "keptUntilMs";

/// The layout of leaderrun's own attributes.
const THIS_LAYOUT: u32 = 1;

pub type Attributes = HashMap<String, AttributeValue>;

/// A lock's item, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub record: Record,
    /// Its `recordVersionNumber`.
    pub version: String,
}

/// A fresh record version number: a random (version 4) UUID, as the lock client makes them.
pub fn new_version() -> String {
    let bits: u128 = rand::random();
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

fn number(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// The item that stores `record` for `lock` at `version`.
pub fn attributes(lock: &str, record: &Record, version: &str) -> Attributes {
    let mut item = Attributes::new();
    item.insert(KEY.into(), AttributeValue::S(lock.into()));
    item.insert(OWNER.into(), AttributeValue::S(record.holder.clone()));
    item.insert(LEASE_DURATION.into(), AttributeValue::S((u64::from(record.ttl_seconds) * 1000).to_string()));
    item.insert(VERSION.into(), AttributeValue::S(version.into()));
    if record.is_released() {
        item.insert(RELEASED.into(), AttributeValue::S("1".into()));
    }
    item.insert(LAYOUT.into(), number(THIS_LAYOUT));
    if let Some(token) = record.token {
        item.insert(TOKEN.into(), number(token));
    }
    item.insert(TRANSITIONS.into(), number(record.transitions));
    if let Some(at) = record.acquired {
        item.insert(ACQUIRED.into(), number(millis(at)));
    }
    if let Some(at) = record.renewed {
        item.insert(RENEWED.into(), number(millis(at)));
    }
    item.insert(REVOKED.into(), AttributeValue::Bool(record.revoked));
    if let Some(until) = record.kept_until {
        item.insert(KEPT_UNTIL.into(), number(millis(until)));
    }
    item
}

fn text<'a>(item: &'a Attributes, name: &str) -> Option<&'a str> {
    match item.get(name)? {
        AttributeValue::S(s) | AttributeValue::N(s) => Some(s),
        _ => None,
    }
}

fn parsed<T: std::str::FromStr>(item: &Attributes, name: &str) -> Result<Option<T>, String> {
    text(item, name).map(|s| s.parse().map_err(|_| format!("its {name} {s:?} is not a number"))).transpose()
}

fn time(item: &Attributes, name: &str) -> Result<Option<SystemTime>, String> {
    Ok(parsed::<u64>(item, name)?.map(|ms| UNIX_EPOCH + Duration::from_millis(ms)))
}

/// The lock name an item stands for, if it has a string key.
pub fn lock_of(item: &Attributes) -> Option<&str> {
    match item.get(KEY)? {
        AttributeValue::S(s) => Some(s),
        _ => None,
    }
}

/// Read an item; the error says why it is not a lock's record.
pub fn parse(item: &Attributes) -> Result<Item, String> {
    let (Some(owner), Some(version)) = (text(item, OWNER), text(item, VERSION)) else {
        return Err(format!("not a lock's item (it has no {OWNER} or no {VERSION})"));
    };
    if let Some(layout) = parsed::<u32>(item, LAYOUT)? {
        if layout != THIS_LAYOUT {
            return Err(format!(
                "written in layout {layout} by another leaderrun version; this one reads layout {THIS_LAYOUT}"
            ));
        }
    }
    let lease_ms: u64 =
        parsed(item, LEASE_DURATION)?.ok_or_else(|| format!("not a lock's item (no {LEASE_DURATION})"))?;
    // Whole seconds, rounded up: a standby must never wait less than the holder's lease.
    let ttl_seconds = u32::try_from(lease_ms.div_ceil(1000).max(1)).unwrap_or(u32::MAX);
    let released = item.contains_key(RELEASED);
    let record = Record {
        holder: if released { String::new() } else { owner.to_string() },
        ttl_seconds,
        acquired: time(item, ACQUIRED)?,
        renewed: time(item, RENEWED)?,
        transitions: parsed(item, TRANSITIONS)?.unwrap_or(0),
        token: parsed(item, TOKEN)?,
        revoked: matches!(item.get(REVOKED), Some(AttributeValue::Bool(true))),
        kept_until: time(item, KEPT_UNTIL)?,
    };
    Ok(Item { record, version: version.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            holder: "host-1".into(),
            ttl_seconds: 15,
            acquired: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            renewed: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_005_456)),
            transitions: 3,
            token: Some(1_700_000_000_000_001),
            revoked: false,
            kept_until: None,
        }
    }

    #[test]
    fn items_round_trip_with_the_lock_clients_names() {
        let item = attributes("nightly", &record(), "v1");
        assert_eq!(lock_of(&item), Some("nightly"));
        assert_eq!(item[OWNER], AttributeValue::S("host-1".into()));
        assert_eq!(item[LEASE_DURATION], AttributeValue::S("15000".into()));
        assert!(!item.contains_key(RELEASED));
        assert_eq!(parse(&item).unwrap(), Item { record: record(), version: "v1".into() });
        let kept = Record { kept_until: Some(UNIX_EPOCH + Duration::from_secs(1_800_000_000)), ..record() };
        assert_eq!(parse(&attributes("x", &kept, "v2")).unwrap().record, kept);
    }

    #[test]
    fn a_released_record_is_marked_as_the_lock_client_marks_it() {
        let released = Record { holder: String::new(), revoked: true, ..record() };
        let item = attributes("nightly", &released, "v3");
        assert_eq!(item[RELEASED], AttributeValue::S("1".into()));
        assert_eq!(parse(&item).unwrap().record, released);
    }

    /// What the lock client itself writes: a lease of `leaseDuration` ms, no token.
    #[test]
    fn an_item_of_the_lock_client_reads_as_a_lease_without_a_token() {
        let mut item = Attributes::new();
        item.insert(KEY.into(), AttributeValue::S("job".into()));
        item.insert(OWNER.into(), AttributeValue::S("java-host".into()));
        item.insert(LEASE_DURATION.into(), AttributeValue::S("10001".into()));
        item.insert(VERSION.into(), AttributeValue::S(new_version()));
        item.insert("data".into(), AttributeValue::B(vec![1, 2].into()));
        let read = parse(&item).unwrap().record;
        assert_eq!((read.holder.as_str(), read.ttl_seconds, read.token), ("java-host", 11, None));
        item.insert(RELEASED.into(), AttributeValue::S("1".into()));
        assert!(parse(&item).unwrap().record.is_released());
    }

    #[test]
    fn other_items_are_not_locks() {
        let mut item = Attributes::new();
        item.insert(KEY.into(), AttributeValue::S("notes".into()));
        assert!(parse(&item).unwrap_err().contains("not a lock's item"));
        let mut later = attributes("x", &record(), "v");
        later.insert(LAYOUT.into(), number(2));
        assert!(parse(&later).unwrap_err().contains("layout 2"));
    }

    #[test]
    fn versions_are_random_uuids() {
        let (a, b) = (new_version(), new_version());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
