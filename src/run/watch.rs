//! `leaderrun watch`: the lock's state, then one line at each change, until SIGINT/SIGTERM.
//!
//! It only looks (DESIGN.md §9, Observing): `status` reads and the store's `observe_change`,
//! which writes nothing and never takes a waiter's turn. On a store that pushes changes it
//! reads only when told that something changed (and once a minute, in case a push channel
//! silently stopped); on a store that pushes writes but not expiry, also when the lease it
//! saw would expire; elsewhere once a second. What changed is worked out by comparing two
//! reads (`changes`), so a change that comes and goes between two reads of a polled store is
//! not seen; the later state always is.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::CommonArgs;
use crate::exit;
use crate::store::Access;
use crate::store::{validate_lock_name, LockRecord, Observing, Store};

use super::{fail, short, store_spec, Shown};

/// How often a store without push is read, and how soon an unreachable one is tried again.
const POLL: Duration = Duration::from_secs(1);
/// Longest wait on a push channel before reading anyway (one that silently stopped).
const SAFETY_READ: Duration = Duration::from_secs(60);
/// A read that takes longer counts as the store being unreachable.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A held lease gone within this of the expiry its last read gave is taken to have expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(500);
/// A later expiry than the last read gave, by more than this, is a renewal.
const RENEWAL_SLACK: Duration = Duration::from_millis(500);

/// What happened between two reads of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The first read: the lock as it is.
    State,
    Acquired,
    /// A new holder, with no free moment seen in between.
    Taken,
    Renewed,
    /// `leaderrun release` asked the holder to stand down.
    Revoked,
    /// The child exited and the lease is kept for --min-hold.
    Kept,
    Released,
    Expired,
}

impl Change {
    pub fn name(self) -> &'static str {
        match self {
            Change::State => "state",
            Change::Acquired => "acquired",
            Change::Taken => "taken",
            Change::Renewed => "renewed",
            Change::Revoked => "revoked",
            Change::Kept => "kept",
            Change::Released => "released",
            Change::Expired => "expired",
        }
    }
}

/// A read and when it was made.
struct Seen {
    record: LockRecord,
    at: Instant,
}

/// What changed from `before` (read `elapsed` ago) to `now`, in the order it happened.
pub fn changes(before: Option<&LockRecord>, elapsed: Duration, now: &LockRecord) -> Vec<Change> {
    let Some(before) = before else { return vec![Change::State] };
    let expected = before.expires_in.map(|left| left.saturating_sub(elapsed));
    match (before.is_held(), now.is_held()) {
        (false, false) => vec![],
        // Taken, and maybe already kept or asked to go, between two reads.
        (false, true) => {
            let mut seen = vec![Change::Acquired];
            if now.revoked {
                seen.push(Change::Revoked);
            }
            if now.kept {
                seen.push(Change::Kept);
            }
            seen
        }
        (true, false) if expected.is_some_and(|left| left <= EXPIRY_SLACK) => vec![Change::Expired],
        (true, false) => vec![Change::Released],
        (true, true) => {
            // Another program's campaigner writes a new token at every renewal: the holder
            // tells who holds it. leaderrun's own holders keep their token for the lease.
            let same_lease = if now.campaigner.is_some() || before.campaigner.is_some() {
                before.holder == now.holder
            } else {
                before.token == now.token && before.holder == now.holder
            };
            if !same_lease {
                return vec![Change::Taken];
            }
            let mut seen = Vec::new();
            if now.revoked && !before.revoked {
                seen.push(Change::Revoked);
            }
            if now.kept && !before.kept {
                seen.push(Change::Kept);
            } else if !now.kept {
                let later = match (expected, now.expires_in) {
                    (Some(expected), Some(left)) => left > expected + RENEWAL_SLACK,
                    _ => false,
                };
                if later || (now.campaigner.is_some() && now.token != before.token) {
                    seen.push(Change::Renewed);
                }
            }
            seen
        }
    }
}

/// One line for a change, as text or JSON.
fn line(change: Change, record: &LockRecord, json: bool) -> anyhow::Result<String> {
    let at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    if json {
        let mut value = serde_json::to_value(Shown::from(record))?;
        value["event"] = change.name().into();
        value["at"] = at.into();
        return Ok(format!("{value}\n"));
    }
    let holder = record.holder.as_deref().unwrap_or("-");
    let what = match change {
        Change::State if record.is_held() => format!("held by {holder}"),
        Change::State => "free".to_string(),
        Change::Released | Change::Expired => "now free".to_string(),
        _ => format!("by {holder}"),
    };
    let mut text = format!("{at} {:<8} {} {what}, token {}", change.name(), record.lock, record.token);
    if record.campaigner.is_some() {
        text.push_str(", another program's campaigner");
    }
    if let Some(left) = record.expires_in {
        text.push_str(&format!(", expires in {}", short(left)));
    }
    text.push('\n');
    Ok(text)
}

/// Write a line; `false` when the reader went away (`watch | head -1`): the watch ends.
fn emit(text: &str) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(err) => Err(err).context("cannot write to standard output"),
    }
}

/// `slot`: the slot of a lock run with --slots to follow (0: the lock itself).
pub async fn watch(common: &CommonArgs, lock: &str, slot: usize, json: bool) -> anyhow::Result<u8> {
    if let Err(err) = validate_lock_name(lock) {
        return Ok(fail(exit::USAGE, err));
    }
    let spec = match store_spec(common) {
        Ok(spec) => spec,
        Err(err) => return Ok(fail(exit::USAGE, err)),
    };
    if let Err(err) = spec.check_lock_name(lock) {
        return Ok(fail(exit::USAGE, err));
    }
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot install signal handlers")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot install signal handlers")?;
    let follow = async {
        let mut down = false;
        let store = loop {
            match spec.open(Access::Existing).await {
                Ok(store) => break crate::slots::SlotStore::new(store.into(), slot),
                Err(err) if err.is_transient() => {
                    if !std::mem::replace(&mut down, true) {
                        tracing::warn!("cannot reach the store, retrying: {err}");
                    }
                    tokio::time::sleep(POLL).await;
                }
                Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
            }
        };
        follow(&store, lock, json, common.verbose > 0, down).await
    };
    tokio::select! {
        code = follow => code,
        _ = interrupt.recv() => Ok(0),
        _ = terminate.recv() => Ok(0),
    }
}

/// Read, say what changed, wait for the next change; until the reader goes away.
async fn follow(store: &dyn Store, lock: &str, json: bool, renewals: bool, mut down: bool) -> anyhow::Result<u8> {
    let mut last: Option<Seen> = None;
    loop {
        let read = tokio::time::timeout(READ_TIMEOUT, store.status(lock)).await;
        let wait = match read {
            Ok(Ok(record)) => {
                if std::mem::replace(&mut down, false) {
                    tracing::warn!("the store answers again");
                }
                let elapsed = last.as_ref().map_or(Duration::ZERO, |seen| seen.at.elapsed());
                for change in changes(last.as_ref().map(|s| &s.record), elapsed, &record) {
                    if (change != Change::Renewed || renewals) && !emit(&line(change, &record, json)?)? {
                        return Ok(0);
                    }
                }
                let wait = next_read(store.observing(), &record);
                last = Some(Seen { record, at: Instant::now() });
                wait
            }
            Ok(Err(err)) if !err.is_transient() => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
            failed => {
                if !std::mem::replace(&mut down, true) {
                    let why = match failed {
                        Ok(Err(err)) => err.to_string(),
                        _ => format!("no answer within {}", short(READ_TIMEOUT)),
                    };
                    tracing::warn!("cannot reach the store, retrying: {why}");
                }
                None
            }
        };
        match wait {
            Some(wait) => store.observe_change(lock, wait).await,
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// How long to wait for a pushed change before reading again; None: read after `POLL`.
fn next_read(observing: Observing, record: &LockRecord) -> Option<Duration> {
    match observing {
        Observing::Polls => None,
        Observing::Pushes => Some(SAFETY_READ),
        // A lease the store still shows although none of it is left (a client-timed store's
        // lapsed record, until a standby takes it) changes only by a write: wait for one.
        Observing::PushesWrites => Some(match record.expires_in {
            Some(left) if !left.is_zero() => (left + Duration::from_millis(20)).min(SAFETY_READ),
            _ => SAFETY_READ,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, token: u64, left: u64) -> LockRecord {
        LockRecord {
            holder: Some(holder.into()),
            token,
            expires_in: Some(Duration::from_secs(left)),
            ..LockRecord::free("l")
        }
    }

    fn free(token: u64) -> LockRecord {
        LockRecord { token, ..LockRecord::free("l") }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_lease_is_taken_renewed_and_given_up() {
        assert_eq!(changes(None, S(0), &free(0)), [Change::State]);
        assert_eq!(changes(Some(&free(0)), S(1), &free(0)), []);
        assert_eq!(changes(Some(&free(0)), S(1), &held("a", 1, 15)), [Change::Acquired]);
        assert_eq!(changes(Some(&held("a", 1, 15)), S(5), &held("a", 1, 10)), [], "only time passed");
        assert_eq!(changes(Some(&held("a", 1, 15)), S(5), &held("a", 1, 15)), [Change::Renewed]);
        assert_eq!(changes(Some(&held("a", 1, 15)), S(5), &free(1)), [Change::Released]);
        assert_eq!(changes(Some(&held("a", 1, 15)), S(15), &free(1)), [Change::Expired]);
        assert_eq!(changes(Some(&held("a", 1, 15)), S(20), &held("b", 2, 15)), [Change::Taken]);
    }

    #[test]
    fn a_revoke_and_a_keep_are_named() {
        let revoked = LockRecord { revoked: true, ..held("a", 1, 14) };
        assert_eq!(changes(Some(&held("a", 1, 15)), S(1), &revoked), [Change::Revoked]);
        let kept = LockRecord { kept: true, ..held("a", 1, 5) };
        assert_eq!(changes(Some(&held("a", 1, 15)), S(1), &kept), [Change::Kept]);
        assert_eq!(changes(Some(&kept), S(5), &free(1)), [Change::Expired], "a keep ends by expiring");
        assert_eq!(changes(Some(&free(0)), S(1), &kept), [Change::Acquired, Change::Kept], "both between two reads");
    }

    #[test]
    fn a_campaigners_new_token_is_a_renewal() {
        let campaigner = crate::store::Campaigner { renewed_at: SystemTime::now(), renews_every: S(5) };
        let at = |token| LockRecord { campaigner: Some(campaigner), ..held("choria", token, 10) };
        assert_eq!(changes(Some(&at(7)), S(5), &at(9)), [Change::Renewed]);
        let other = LockRecord { campaigner: Some(campaigner), ..held("other", 10, 10) };
        assert_eq!(changes(Some(&at(9)), S(5), &other), [Change::Taken]);
    }

    #[test]
    fn json_lines_carry_the_status_fields_and_the_event() {
        let text = line(Change::Acquired, &held("a", 3, 15), true).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["event"], "acquired");
        assert_eq!(value["fencing_token"], 3);
        assert_eq!(value["holder"], "a");
        assert!(value["at"].as_str().unwrap().ends_with('Z'));
        let text = line(Change::State, &free(3), false).unwrap();
        assert!(text.contains(" state    l free, token 3"), "{text}");
    }
}
