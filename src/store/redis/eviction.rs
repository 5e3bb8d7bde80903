//! Refusing a Redis server that may evict leaderrun's keys.
//!
//! Under memory pressure Redis evicts keys as its `maxmemory-policy` says. With a
//! `volatile-*` policy a held lease can vanish (its key has a PX expiry): a second holder
//! starts beside the first one's child. With an `allkeys-*` policy the token counter can
//! vanish too: the next acquisition starts it again at 1, and fencing tokens repeat. Only
//! `noeviction` keeps every key; a full server then refuses writes (OOM), which the store
//! reports as unavailable: a renewal fails and the holder stops its child by its deadline.
//!
//! Any other policy is refused whatever `maxmemory` is. While `maxmemory` is 0 (no limit)
//! nothing is evicted, but `CONFIG SET maxmemory ...` arms the policy at once, under a
//! running holder, with no restart and nothing that tells leaderrun; managed services set
//! a limit of their own. The policy is the standing risk; the limit only decides when it
//! strikes.
//!
//! The policy is read with `CONFIG GET`. Managed services often disable or rename CONFIG,
//! and an ACL user may not be allowed it, so then from `INFO memory`. When neither answers,
//! the store is refused too: a policy nobody can see may be one that evicts, and the
//! message says how to let it be seen. `?allow-eviction=1` accepts the risk and skips the
//! check.
//!
//! What remains: the policy is read when the store opens. A policy changed later
//! (`CONFIG SET maxmemory-policy`) is not seen by a holder that is already running, only
//! by the next run that opens the store.
//!
//! The epoch mark (`{prefix}epoch`, see `scripts.rs`) has no expiry, so no `volatile-*` policy
//! evicts it. An `allkeys-*` policy (only with `?allow-eviction=1`) may: the next acquire then
//! finds leases but no mark and waits out a grace, as after a failover; it may evict the
//! `{prefix}locks` set too, and then the store looks new and the guard is lost with it.

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};

use super::{error, text, transient};
use crate::store::{Result, StoreError};

/// The one policy under which Redis never deletes a key before its expiry.
const SAFE_POLICY: &str = "noeviction";

/// Refuse the server unless its policy is `noeviction`, in one line that names the
/// setting and the fix. A server that cannot be reached is unavailable, as for any call.
pub(super) async fn refuse_an_evicting_server(conn: &mut (impl ConnectionLike + Send), shown: &str) -> Result<()> {
    let refused = |why: String, fix: &str| {
        Err(StoreError::refused(format!(
            "Redis store {shown}: {why}, so Redis may evict a held lease (a second holder starts) or the \
             fencing-token counter (tokens repeat); {fix}, or accept the risk with ?allow-eviction=1"
        )))
    };
    match policy(conn).await.map_err(|e| error(shown, e))? {
        Some(policy) if policy.eq_ignore_ascii_case(SAFE_POLICY) => Ok(()),
        Some(policy) => refused(
            format!("maxmemory-policy is {policy}"),
            "run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf)",
        ),
        None => refused(
            "maxmemory-policy cannot be read (the server answers neither CONFIG GET nor INFO to this user)".into(),
            "make it noeviction and let this user run INFO",
        ),
    }
}

/// The server's eviction policy: from `CONFIG GET`, else from `INFO memory`; `None` when
/// neither answers. Only an error that a retry may cure (the server is unreachable) is one.
async fn policy(conn: &mut (impl ConnectionLike + Send)) -> std::result::Result<Option<String>, RedisError> {
    tracing::trace!(op = "config_get", "store request");
    let config = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(conn).await;
    if let Some(policy) = answer(config)?.as_ref().and_then(config_value) {
        return Ok(Some(policy));
    }
    tracing::trace!(op = "info", "store request");
    let info = redis::cmd("INFO").arg("memory").query_async(conn).await;
    Ok(answer(info)?.as_ref().and_then(|value| info_field(value, "maxmemory_policy")))
}

/// A command's answer; `None` when the server refused it (unknown or renamed, not
/// permitted): the next way of reading the policy is tried then.
fn answer(result: redis::RedisResult<Value>) -> std::result::Result<Option<Value>, RedisError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(err) if transient(&err) => Err(err),
        Err(err) => {
            tracing::debug!("reading maxmemory-policy: {err}");
            Ok(None)
        }
    }
}

/// The value of a one-setting `CONFIG GET`: `[name, value]` (RESP2) or `{name: value}`
/// (RESP3); an empty answer (no such setting, as some proxies say) is none.
fn config_value(value: &Value) -> Option<String> {
    match value {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, value)| text(value)),
        _ => None,
    }
}

/// One `field:value` line of an `INFO` answer.
fn info_field(value: &Value, field: &str) -> Option<String> {
    let body = match value {
        Value::VerbatimString { text, .. } => text.clone(),
        other => text(other)?,
    };
    body.lines().find_map(|line| Some(line.strip_prefix(field)?.strip_prefix(':')?.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn policy_answers() {
        let resp2 = Value::Array(vec![bulk("maxmemory-policy"), bulk("allkeys-lru")]);
        assert_eq!(config_value(&resp2).as_deref(), Some("allkeys-lru"));
        let resp3 = Value::Map(vec![(bulk("maxmemory-policy"), bulk("noeviction"))]);
        assert_eq!(config_value(&resp3).as_deref(), Some("noeviction"));
        assert_eq!(config_value(&Value::Array(vec![])), None);
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory:0\r\nmaxmemory_policy:volatile-ttl\r\nmem_fragmentation_ratio:1\r\n";
        assert_eq!(info_field(&bulk(info), "maxmemory_policy").as_deref(), Some("volatile-ttl"));
        let verbatim = Value::VerbatimString { format: redis::VerbatimFormat::Text, text: info.into() };
        assert_eq!(info_field(&verbatim, "maxmemory_policy").as_deref(), Some("volatile-ttl"));
        assert_eq!(info_field(&bulk("# Memory\r\nmaxmemory:0\r\n"), "maxmemory_policy"), None);
    }
}
