//! A lock's record as a `coordination.k8s.io/v1` Lease, written exactly as client-go's
//! LeaseLock writes its leader election record, so kubectl and client-go electors read it:
//!
//! | record        | Lease                              |
//! |---------------|------------------------------------|
//! | holder        | spec.holderIdentity ("" released)  |
//! | ttl_seconds   | spec.leaseDurationSeconds          |
//! | acquired      | spec.acquireTime (MicroTime)       |
//! | renewed       | spec.renewTime (MicroTime)         |
//! | transitions   | spec.leaseTransitions              |
//!
//! leaderrun's own fields live in annotations under `leaderrun.dev/`: `token`, `revoked`,
//! `kept-until` (the server's clock, RFC 3339), `lock` (the lock's name, see `names.rs`) and
//! `holder`. client-go keeps a Lease's metadata when it takes one over, so annotations a
//! leaderrun holder wrote would outlive its tenure; they describe the record only while
//! `leaderrun.dev/holder` still names the Lease's holder, and are ignored after that.
//! Everything else a peer put on the Lease (labels, other annotations, spec.strategy,
//! spec.preferredHolder) is carried over on every write.

use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use crate::store::client_timed::{Found, Record, Version};

/// The prefix of every annotation leaderrun writes.
const PREFIX: &str = "leaderrun.dev/";
const TOKEN: &str = "leaderrun.dev/token";
const REVOKED: &str = "leaderrun.dev/revoked";
const KEPT_UNTIL: &str = "leaderrun.dev/kept-until";
const HOLDER: &str = "leaderrun.dev/holder";
pub(super) const LOCK: &str = "leaderrun.dev/lock";

/// The record a Lease holds.
pub(super) fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    // Ours only while the holder they were written for still holds the Lease.
    let ours = annotations.get(HOLDER).is_some_and(|h| *h == holder);
    let annotation = |key: &str| annotations.get(key).filter(|_| ours);
    Record {
        holder,
        ttl_seconds: spec.lease_duration_seconds.and_then(|s| u32::try_from(s).ok()).unwrap_or(0),
        acquired: spec.acquire_time.map(|t| SystemTime::from(t.0)),
        renewed: spec.renew_time.map(|t| SystemTime::from(t.0)),
        transitions: spec.lease_transitions.and_then(|t| u32::try_from(t).ok()).unwrap_or(0),
        token: annotation(TOKEN).and_then(|t| t.parse().ok()),
        revoked: annotation(REVOKED).is_some_and(|r| r == "true"),
        kept_until: annotation(KEPT_UNTIL).and_then(|t| t.parse::<Timestamp>().ok()).map(SystemTime::from),
    }
}

/// The Lease to write for `record`: `base` (the Lease as last read, or a new one) with the
/// record's fields in place and everything else kept.
pub(super) fn with_record(mut base: Lease, lock: &str, record: &Record) -> Lease {
    let annotations = base.metadata.annotations.get_or_insert_with(Default::default);
    annotations.retain(|key, _| !key.starts_with(PREFIX));
    annotations.insert(LOCK.into(), lock.into());
    annotations.insert(HOLDER.into(), record.holder.clone());
    if let Some(token) = record.token {
        annotations.insert(TOKEN.into(), token.to_string());
    }
    if record.revoked {
        annotations.insert(REVOKED.into(), "true".into());
    }
    if let Some(until) = record.kept_until.and_then(timestamp) {
        annotations.insert(KEPT_UNTIL.into(), until.to_string());
    }
    let spec = base.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(record.holder.clone());
    // The server refuses a duration of 0; a record without one has none.
    spec.lease_duration_seconds = i32::try_from(record.ttl_seconds).ok().filter(|s| *s > 0);
    spec.acquire_time = record.acquired.and_then(timestamp).map(MicroTime);
    spec.renew_time = record.renewed.and_then(timestamp).map(MicroTime);
    spec.lease_transitions = Some(i32::try_from(record.transitions).unwrap_or(i32::MAX));
    base
}

/// A Lease that does not exist yet, named `name`.
pub(super) fn new_lease(name: &str) -> Lease {
    Lease { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, spec: None }
}

/// A Lease's version: its resourceVersion and its uid. A replace sends both back as
/// preconditions: the resourceVersion catches any write since, and the uid catches a Lease
/// that was deleted since (`kubectl delete lease`), which the API server would otherwise
/// re-create from the replace.
pub(super) fn version_of(lease: &Lease) -> Option<Version> {
    let (rv, uid) = (lease.metadata.resource_version.as_ref()?, lease.metadata.uid.as_ref()?);
    Some(Version(format!("{rv}/{uid}")))
}

/// The record and version of a Lease that carries a version (every Lease the server sends does).
pub(super) fn found_of(lease: &Lease) -> Option<Found> {
    Some(Found { record: record_of(lease), version: version_of(lease)? })
}

/// The resourceVersion and the uid of a version `version_of` made.
pub(super) fn parts(version: &Version) -> Option<(&str, &str)> {
    version.0.split_once('/')
}

/// A resourceVersion as a number (an etcd revision); 0 if it is not one.
pub(super) fn revision(resource_version: Option<&str>) -> u64 {
    resource_version.and_then(|rv| rv.parse().ok()).unwrap_or(0)
}

fn timestamp(at: SystemTime) -> Option<Timestamp> {
    Timestamp::try_from(at).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record() -> Record {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_790_000_000_123_456);
        Record {
            holder: "host-1".into(),
            ttl_seconds: 15,
            acquired: Some(at),
            renewed: Some(at + Duration::from_secs(5)),
            transitions: 3,
            token: Some(42),
            revoked: true,
            kept_until: Some(at + Duration::from_secs(10)),
        }
    }

    #[test]
    fn a_record_round_trips_and_is_written_as_client_go_writes_it() {
        let lease = with_record(new_lease("nightly"), "nightly", &record());
        assert_eq!(record_of(&lease), record());
        let json = serde_json::to_value(&lease).unwrap();
        let spec = &json["spec"];
        assert_eq!(spec["holderIdentity"], "host-1");
        assert_eq!(spec["leaseDurationSeconds"], 15);
        assert_eq!(spec["leaseTransitions"], 3);
        assert_eq!(spec["acquireTime"], "2026-09-21T14:13:20.123456Z");
        let annotations = &json["metadata"]["annotations"];
        assert_eq!(
            (&annotations["leaderrun.dev/token"], &annotations["leaderrun.dev/lock"]),
            (&"42".into(), &"nightly".into())
        );
    }

    #[test]
    fn what_a_peer_wrote_is_kept_and_stale_annotations_are_dropped() {
        let mut lease = with_record(new_lease("x"), "x", &record());
        lease.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        lease.metadata.annotations.as_mut().unwrap().insert("other.io/note".into(), "keep me".into());
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        let released = Record { holder: String::new(), token: Some(42), revoked: false, kept_until: None, ..record() };
        let lease = with_record(lease, "x", &released);
        let meta = &lease.metadata;
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "a");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["other.io/note"], "keep me");
        assert!(!annotations.contains_key(REVOKED) && !annotations.contains_key(KEPT_UNTIL));
        assert_eq!(lease.spec.as_ref().unwrap().strategy.as_deref(), Some("OldestEmulationVersion"));
        assert_eq!(record_of(&lease), released);
    }

    #[test]
    fn a_peer_that_took_the_lease_over_owns_no_leaderrun_fields() {
        // client-go keeps the metadata it read and writes only the spec.
        let mut lease = with_record(new_lease("x"), "x", &record());
        lease.spec.as_mut().unwrap().holder_identity = Some("client-go-pod".into());
        let seen = record_of(&lease);
        assert_eq!(
            (seen.holder.as_str(), seen.token, seen.revoked, seen.kept_until),
            ("client-go-pod", None, false, None)
        );
    }

    #[test]
    fn versions_carry_the_resource_version_and_the_uid() {
        let mut lease = new_lease("x");
        assert_eq!(version_of(&lease), None);
        lease.metadata.resource_version = Some("17".into());
        lease.metadata.uid = Some("u-1".into());
        let version = version_of(&lease).unwrap();
        assert_eq!(parts(&version), Some(("17", "u-1")));
        assert_eq!((revision(Some("17")), revision(Some("x")), revision(None)), (17, 0, 0));
    }
}
