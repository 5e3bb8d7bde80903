//! One entity per lock: its key (`KIND/lock name`, in the namespace) and its properties
//! (the record), as the Datastore v1 REST API writes them.
//!
//! Properties: `leaderrun` (1: marks leaderrun's entities), `holder`, `ttl_seconds`,
//! `acquired`, `renewed` (timestamps on the writer's wall clock, display only),
//! `transitions`, `token`, `revoked`, `kept_until`, and `nonce`: a random number written
//! with every write. Datastore gives a write that changes nothing the version the entity
//! already had (documented, and the emulator does it), and the emulator reuses versions
//! after a restart; with the nonce, equal (version, nonce) pairs mean an unchanged record.
//! Every property is excluded from indexes: nothing queries them (listing asks for the
//! kind only), and unindexed properties make writes cheaper.
//!
//! Integers travel as strings (`integerValue`), times as RFC 3339 (`timestampValue`).

use std::time::SystemTime;

use serde_json::{json, Map, Value};

use super::target::is_reserved;
use crate::store::client_timed::{Record, Version};

/// Where the entities live: the partition and the kind.
#[derive(Debug, Clone)]
pub struct Place {
    pub project: String,
    pub database: String,
    pub namespace: String,
    pub kind: String,
}

impl Place {
    /// The partition (project, database, namespace), with the defaults left out.
    pub fn partition(&self) -> Value {
        let mut partition = Map::new();
        partition.insert("projectId".into(), json!(self.project));
        if !self.database.is_empty() {
            partition.insert("databaseId".into(), json!(self.database));
        }
        if !self.namespace.is_empty() {
            partition.insert("namespaceId".into(), json!(self.namespace));
        }
        Value::Object(partition)
    }

    /// The key of `name`'s entity.
    pub fn key(&self, name: &str) -> Value {
        json!({"partitionId": self.partition(), "path": [{"kind": self.kind, "name": name}]})
    }

    /// `KIND/name`, for messages.
    pub fn shown(&self, name: &str) -> String {
        format!("{}/{name}", self.kind)
    }
}

/// Why `lock` cannot be a key name, if it cannot (Datastore reserves `__…__`).
pub fn check_lock_name(lock: &str) -> Result<(), String> {
    if is_reserved(lock) {
        return Err(format!(
            "--lock {lock:?}: Datastore reserves key names that start and end with two underscores (__…__)"
        ));
    }
    Ok(())
}

/// A version as this store hands it to the core: the entity version and the nonce.
pub fn version(entity_version: u64, nonce: i64) -> Version {
    Version(format!("{entity_version} {nonce}"))
}

/// The entity version and nonce of `version` (0 and 0 if it is not one of this store's).
pub fn parse_version(version: &Version) -> (u64, i64) {
    let (v, nonce) = version.0.split_once(' ').unwrap_or((&version.0, "0"));
    (v.parse().unwrap_or(0), nonce.parse().unwrap_or(0))
}

/// The entity for `record` under `key`, with a fresh nonce; and that nonce.
pub fn entity(key: Value, record: &Record) -> (Value, i64) {
    let nonce: i64 = rand::random();
    let mut properties = Map::new();
    let mut put = |name: &str, value: Value| {
        let mut value = value;
        value["excludeFromIndexes"] = json!(true);
        properties.insert(name.to_string(), value);
    };
    put("leaderrun", json!({"integerValue": "1"}));
    put("holder", json!({"stringValue": record.holder}));
    put("ttl_seconds", integer(record.ttl_seconds));
    put("transitions", integer(record.transitions));
    put("revoked", json!({"booleanValue": record.revoked}));
    put("nonce", json!({"integerValue": nonce.to_string()}));
    if let Some(token) = record.token {
        put("token", integer(token));
    }
    for (name, at) in [("acquired", record.acquired), ("renewed", record.renewed), ("kept_until", record.kept_until)] {
        if let Some(at) = at {
            put(name, json!({"timestampValue": humantime::format_rfc3339_micros(at).to_string()}));
        }
    }
    (json!({"key": key, "properties": properties}), nonce)
}

fn integer(n: impl ToString) -> Value {
    json!({"integerValue": n.to_string()})
}

/// The record an entity holds, and its nonce; `Err` if it is not leaderrun's (no
/// `leaderrun` property), or not one this version can read.
pub fn record(entity: &Value) -> Result<(Record, i64), String> {
    let properties = &entity["properties"];
    let int = |name: &str| -> Option<i64> {
        match &properties[name]["integerValue"] {
            Value::String(text) => text.parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    };
    match int("leaderrun") {
        Some(1) => {}
        Some(other) => return Err(format!("written by a newer leaderrun (layout {other})")),
        None => return Err("not leaderrun's (it has no leaderrun property)".into()),
    }
    let time = |name: &str| -> Option<SystemTime> {
        properties[name]["timestampValue"].as_str().and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    };
    let small = |name: &str| int(name).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let record = Record {
        holder: properties["holder"]["stringValue"].as_str().unwrap_or_default().to_string(),
        ttl_seconds: small("ttl_seconds"),
        acquired: time("acquired"),
        renewed: time("renewed"),
        transitions: small("transitions"),
        token: int("token").and_then(|t| u64::try_from(t).ok()),
        revoked: properties["revoked"]["booleanValue"].as_bool().unwrap_or(false),
        kept_until: time("kept_until"),
    };
    Ok((record, int("nonce").unwrap_or(0)))
}

/// The lock name an entity's key stands for (the last path element's name).
pub fn name_of(entity: &Value) -> Option<&str> {
    entity["key"]["path"].as_array()?.last()?["name"].as_str()
}

/// A version number as the API sends it (an int64 as a string).
pub fn number(value: &Value) -> Option<u64> {
    match value {
        Value::String(text) => text.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn records_survive_the_round_trip() {
        let at = UNIX_EPOCH + Duration::from_micros(1_795_424_472_060_547);
        let written = Record {
            holder: "host-1 pid 42 é".into(),
            ttl_seconds: 15,
            acquired: Some(at),
            renewed: Some(at + Duration::from_secs(5)),
            transitions: 3,
            token: Some(1_795_424_472_060_548),
            revoked: true,
            kept_until: Some(at + Duration::from_secs(60)),
        };
        let place =
            Place { project: "p".into(), database: String::new(), namespace: "ns".into(), kind: "Lease".into() };
        let (entity, nonce) = super::entity(place.key("lock"), &written);
        assert_eq!(record(&entity).unwrap(), (written.clone(), nonce));
        assert_eq!(name_of(&entity), Some("lock"));
        assert!(entity["properties"].as_object().unwrap().values().all(|v| v["excludeFromIndexes"] == json!(true)));
        assert_eq!(entity["key"]["partitionId"], json!({"projectId": "p", "namespaceId": "ns"}));
        let (again, other) = super::entity(place.key("lock"), &written);
        assert_ne!(nonce, other, "every write gets its own nonce");
        assert_ne!(entity, again);
    }

    #[test]
    fn someone_elses_entity_is_not_a_record() {
        assert!(record(&json!({"properties": {"holder": {"stringValue": "x"}}}))
            .unwrap_err()
            .contains("not leaderrun's"));
    }

    #[test]
    fn versions_carry_the_nonce() {
        assert_eq!(parse_version(&version(17, -5)), (17, -5));
        assert_ne!(version(17, 1), version(17, 2));
    }

    #[test]
    fn reserved_lock_names_are_refused() {
        assert!(check_lock_name("__scatter__").unwrap_err().contains("two underscores"));
        assert!(check_lock_name("__init").is_ok());
    }
}
