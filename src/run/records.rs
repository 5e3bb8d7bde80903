//! `status`, `list` and `release`: the store's records as a user reads them, a semaphore's
//! slots (`--slots`) each shown as its own lease of the lock.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::cli::{CommonArgs, SlotsArg};
use crate::exit;
use crate::slots::{self, SlotStore};
use crate::store::{LockRecord, Store};

use super::{fail, open_for_reading, print};

/// The records `status` and `release` act on, each with its slot; `None` and the status to
/// exit with if the store cannot be read. `Some(slot)` only for a lock with slots.
async fn slot_records(
    store: &Arc<dyn Store>,
    lock: &str,
    asked: &SlotsArg,
) -> Result<Vec<(Option<usize>, LockRecord)>, u8> {
    let read = match asked.slot {
        Some(slot) => SlotStore::new(store.clone(), slot).status(lock).await.map(|r| vec![(Some(slot), r)]),
        None => slots::read(store, lock, asked.slots).await.map(|records| {
            let several = records.len() > 1 || asked.slots.is_some();
            records.into_iter().enumerate().map(|(slot, r)| (several.then_some(slot), r)).collect()
        }),
    };
    read.map_err(|err| fail(exit::STORE_UNAVAILABLE, err))
}

/// The entry `--json` prints as one object, as it always did for a plain lock (and for the
/// one slot `--slot` names); `None`: the entries are printed as a list, each with its slot.
fn alone<'a, T>(asked: &SlotsArg, entries: &'a [(Option<usize>, T)]) -> Option<(Option<usize>, &'a T)> {
    match entries {
        [(slot, entry)] if slot.is_none() || asked.slot.is_some() => Some((*slot, entry)),
        _ => None,
    }
}

pub(super) async fn status(common: &CommonArgs, lock: &str, asked: &SlotsArg, json: bool) -> anyhow::Result<u8> {
    let store: Arc<dyn Store> = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store.into(),
        Err(code) => return Ok(code),
    };
    let records = match slot_records(&store, lock, asked).await {
        Ok(records) => records,
        Err(code) => return Ok(code),
    };
    let text = match (json, alone(asked, &records), records.as_slice()) {
        (true, Some((slot, record)), _) => {
            format!("{}\n", serde_json::to_string(&Shown::from(record).with_slot(slot))?)
        }
        (true, None, _) => {
            let shown: Vec<Shown> =
                records.iter().map(|(slot, r)| Shown::from(r).with_slot(Some(slot.unwrap_or(0)))).collect();
            format!("{}\n", serde_json::to_string(&shown)?)
        }
        (false, _, [(slot, record)]) => show_record(record, *slot),
        (false, _, _) => show_slots(lock, &records),
    };
    print(&text)?;
    Ok(if records.iter().any(|(_, r)| r.is_held()) { 0 } else { exit::NOT_HELD })
}

pub(super) async fn list(common: &CommonArgs, json: bool) -> anyhow::Result<u8> {
    let store = match open_for_reading(common, None).await {
        Ok(store) => store,
        Err(code) => return Ok(code),
    };
    let records = match store.list().await {
        Ok(records) => records,
        Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
    };
    // A slot's record under its lock's name, with its slot number.
    let records: Vec<(Option<usize>, LockRecord)> = records
        .into_iter()
        .map(|mut r| {
            let (lock, slot) = slots::parse(&r.lock);
            let slot = (slot > 0).then_some(slot);
            r.lock = lock.to_string();
            (slot, r)
        })
        .collect();
    let mut text = String::new();
    if json {
        let shown: Vec<Shown> = records.iter().map(|(slot, r)| Shown::from(r).with_slot(*slot)).collect();
        text = format!("{}\n", serde_json::to_string(&shown)?);
    } else if !records.is_empty() {
        text.push_str(&format!("{:<30} {:<5} {:>8} {:>11}  HOLDER\n", "LOCK", "STATE", "TOKEN", "EXPIRES IN"));
        for (slot, r) in &records {
            let name = slot.map_or_else(|| r.lock.clone(), |s| format!("{} [slot {s}]", r.lock));
            text.push_str(&format!(
                "{:<30} {:<5} {:>8} {:>11}  {}\n",
                name,
                if r.is_held() { "held" } else { "free" },
                r.token,
                r.expires_in.map(short).unwrap_or_else(|| "-".into()),
                r.holder.as_deref().unwrap_or("-")
            ));
        }
    }
    print(&text)?;
    Ok(0)
}

pub(super) async fn release(common: &CommonArgs, lock: &str, asked: &SlotsArg, json: bool) -> anyhow::Result<u8> {
    let store: Arc<dyn Store> = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store.into(),
        Err(code) => return Ok(code),
    };
    // Every slot asked about, or else every slot the store has seen, is asked to stand down,
    // held or not: a slot taken since it was read is then stood down too.
    let slots: Vec<Option<usize>> = match (asked.slot, asked.slots) {
        (Some(slot), _) => vec![Some(slot)],
        (None, Some(count)) => (0..count).map(Some).collect(),
        (None, None) => match slot_records(&store, lock, asked).await {
            Ok(records) => records.into_iter().map(|(slot, _)| slot).collect(),
            Err(code) => return Ok(code),
        },
    };
    let mut revoked = Vec::new();
    for slot in slots {
        match SlotStore::new(store.clone(), slot.unwrap_or(0)).revoke(lock).await {
            Ok(before) => revoked.push((slot, before)),
            Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
        }
    }
    let text = match (json, alone(asked, &revoked)) {
        (true, Some((slot, before))) => format!("{}\n", released_json(lock, slot, before)),
        (true, None) => {
            let all: Vec<_> =
                revoked.iter().map(|(slot, before)| released_json(lock, Some(slot.unwrap_or(0)), before)).collect();
            format!("{}\n", serde_json::Value::Array(all))
        }
        (false, _) => revoked.iter().map(|(slot, before)| released_text(lock, *slot, before)).collect(),
    };
    print(&text)?;
    Ok(if revoked.iter().any(|(_, before)| before.is_some()) { 0 } else { exit::NOT_HELD })
}

fn released_json(lock: &str, slot: Option<usize>, before: &Option<LockRecord>) -> serde_json::Value {
    let mut out = serde_json::json!({
        "lock": lock,
        "release_requested": before.is_some(),
        "holder": before.as_ref().and_then(|r| r.holder.clone()),
        "token": before.as_ref().map(|r| r.token),
    });
    if let Some(slot) = slot {
        out["slot"] = slot.into();
    }
    out
}

fn released_text(lock: &str, slot: Option<usize>, before: &Option<LockRecord>) -> String {
    let what = match slot {
        Some(slot) => format!("slot {slot} of {lock:?}"),
        None => format!("{lock:?}"),
    };
    match before {
        Some(LockRecord { holder, token, expires_in, campaigner: Some(campaigner), .. }) => format!(
            "asked {} (token {token}) to release {what}: it is another program's campaigner (a Choria leader), \
             which notices at its next renewal, within {}, and stops; the lock stays taken until its key \
             expires, in {}\n",
            holder.as_deref().unwrap_or("-"),
            short(campaigner.renews_every),
            expires_in.map(short).unwrap_or_else(|| "-".into()),
        ),
        Some(r) => format!(
            "asked {} (token {}) to release {what}: it stops its child at its next renewal, then frees the lock \
             (at the latest when its lease expires, in {}); a lock only kept for --min-hold is free now\n",
            r.holder.as_deref().unwrap_or("-"),
            r.token,
            r.expires_in.map(short).unwrap_or_else(|| "-".into()),
        ),
        None => format!("{what} was not held\n"),
    }
}

/// A record as `--json` shows it.
#[derive(serde::Serialize)]
pub(super) struct Shown<'a> {
    lock: &'a str,
    /// The slot of a lock run with --slots (status of such a lock shows every slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<usize>,
    held: bool,
    holder: Option<&'a str>,
    fencing_token: u64,
    held_since: Option<String>,
    /// For another program's campaigner (a Choria leader): its last renewal, since when it
    /// holds the lock is not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed_at: Option<String>,
    expires_in_seconds: Option<f64>,
    release_requested: bool,
    /// Its child has exited; the lease is only kept for --min-hold.
    kept_for_min_hold: bool,
}

impl Shown<'_> {
    fn with_slot(self, slot: Option<usize>) -> Self {
        Shown { slot, ..self }
    }
}

impl<'a> From<&'a LockRecord> for Shown<'a> {
    fn from(r: &'a LockRecord) -> Self {
        Shown {
            lock: &r.lock,
            slot: None,
            held: r.is_held(),
            holder: r.holder.as_deref(),
            fencing_token: r.token,
            held_since: r.held_since.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            renewed_at: r.campaigner.map(|c| humantime::format_rfc3339_seconds(c.renewed_at).to_string()),
            expires_in_seconds: r.expires_in.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
            release_requested: r.revoked,
            kept_for_min_hold: r.kept,
        }
    }
}

pub(super) fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// A lock's slots, one line each.
fn show_slots(lock: &str, records: &[(Option<usize>, LockRecord)]) -> String {
    let held = records.iter().filter(|(_, r)| r.is_held()).count();
    let mut text = format!("lock:        {lock}\nslots:       {} seen, {held} held\n", records.len());
    for (slot, r) in records {
        let mut line = format!("slot {:<3}     {}", slot.unwrap_or(0), state(r));
        if let Some(holder) = &r.holder {
            line.push_str(&format!(" by {holder}"));
        }
        line.push_str(&format!(", token {}", r.token));
        if let Some(left) = r.expires_in {
            line.push_str(&format!(", expires in {}", short(left)));
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}

fn state(r: &LockRecord) -> &'static str {
    match (r.is_held(), r.revoked, r.kept) {
        (true, true, _) => "held (asked to release by leaderrun release)",
        (true, false, true) => "held (kept for --min-hold: its child has exited)",
        (true, false, false) => "held",
        _ => "free",
    }
}

fn show_record(r: &LockRecord, slot: Option<usize>) -> String {
    let mut text = format!("lock:        {}\n", r.lock);
    if let Some(slot) = slot {
        text.push_str(&format!("slot:        {slot}\n"));
    }
    text.push_str(&format!("state:       {}\n", state(r)));
    if let Some(holder) = &r.holder {
        text.push_str(&format!("holder:      {holder}\n"));
    }
    text.push_str(&format!("token:       {}\n", r.token));
    if let Some(since) = r.held_since {
        let ago = SystemTime::now().duration_since(since).unwrap_or_default();
        text.push_str(&format!(
            "held since:  {} ({} ago)\n",
            humantime::format_rfc3339_seconds(since),
            short(Duration::from_secs(ago.as_secs()))
        ));
    }
    if let Some(campaigner) = &r.campaigner {
        // Its key keeps only its last write: when it was first taken is not known.
        let ago = SystemTime::now().duration_since(campaigner.renewed_at).unwrap_or_default();
        text.push_str(&format!(
            "renewed at:  {} ({} ago; another program's campaigner, renewing every {}: the token is its last \
             renewal's revision)\n",
            humantime::format_rfc3339_seconds(campaigner.renewed_at),
            short(Duration::from_secs(ago.as_secs())),
            short(campaigner.renews_every)
        ));
    }
    if let Some(left) = r.expires_in {
        text.push_str(&format!("expires in:  {}\n", short(left)));
    }
    text
}
