//! `leaderrun check`: is the lock held now (by that token)?
//!
//! Inside a leaderrun child, asked about the child's own lock, the answer comes from the
//! parent's lease file (`observe::lease_file`): the stop time the parent last published,
//! compared with CLOCK_BOOTTIME here. No request, no credentials, no running parent needed;
//! never "yes" after the parent's stop time. Anywhere else the store is read: every store's
//! `status` is its most linearizable read (etcd's default reads, ZooKeeper after a `sync`).

use std::path::PathBuf;

use crate::cli::CommonArgs;
use crate::clock::boottime;
use crate::exit;
use crate::observe::lease_file::{self, Published};

use super::{fail, open_for_reading};
use crate::slots::SlotStore;
use crate::store::Store;

/// Where the answer comes from.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    /// The parent leaderrun's lease file: this is its child, asking about its own lock.
    Parent(PathBuf),
    /// The store.
    Store,
}

/// The lock and token asked about, and where to look, from the flags and the environment
/// (`env`: a variable's value, so that tests can give their own).
fn resolve(
    lock: Option<String>,
    token: Option<u64>,
    slot: Option<usize>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Asked, Option<u64>, Source), String> {
    let own_lock = env("LEADERRUN_LOCK");
    let lock = match lock.or_else(|| own_lock.clone()) {
        Some(lock) => lock,
        None => return Err("give --lock NAME (it defaults to LEADERRUN_LOCK only inside a leaderrun child)".into()),
    };
    if own_lock.as_deref() != Some(lock.as_str()) {
        return Ok((Asked { lock, slot: slot.unwrap_or(0) }, token, Source::Store));
    }
    let own_slot = match env("LEADERRUN_SLOT") {
        Some(text) => text.trim().parse().map_err(|_| format!("LEADERRUN_SLOT={text:?} is not a number"))?,
        None => 0,
    };
    let asked = Asked { lock, slot: slot.unwrap_or(own_slot) };
    let Some(file) = env(lease_file::VARIABLE).filter(|_| asked.slot == own_slot) else {
        return Ok((asked, token, Source::Store));
    };
    let token = match token {
        Some(token) => Some(token),
        None => match env("LEADERRUN_FENCING_TOKEN") {
            Some(text) => {
                Some(text.trim().parse().map_err(|_| format!("LEADERRUN_FENCING_TOKEN={text:?} is not a number"))?)
            }
            None => None,
        },
    };
    Ok((asked, token, Source::Parent(PathBuf::from(file))))
}

/// The lock asked about, and which of its slots (0 for a plain lock).
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    lock: String,
    slot: usize,
}

pub async fn check(
    common: &CommonArgs,
    lock: Option<String>,
    token: Option<u64>,
    slot: Option<usize>,
) -> anyhow::Result<u8> {
    let (Asked { lock, slot }, token, source) = match resolve(lock, token, slot, |name| std::env::var(name).ok()) {
        Ok(resolved) => resolved,
        Err(err) => return Ok(fail(exit::USAGE, err)),
    };
    let held = match source {
        // A file that is gone or unreadable: the parent's lease is over.
        Source::Parent(file) => Published::read(&file).is_some_and(|p| p.holds_at(boottime(), token)),
        Source::Store => {
            let store = match open_for_reading(common, Some(&lock)).await {
                Ok(store) => SlotStore::new(store.into(), slot),
                Err(code) => return Ok(code),
            };
            match store.status(&lock).await {
                Ok(record) => record.is_held() && !record.kept && token.is_none_or(|t| t == record.token),
                Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
            }
        }
    };
    Ok(if held { 0 } else { exit::NOT_HELD })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    fn asked(lock: &str, slot: usize) -> Asked {
        Asked { lock: lock.into(), slot }
    }

    #[test]
    fn inside_a_child_its_own_lock_is_answered_from_the_parent() {
        let child =
            [("LEADERRUN_LOCK", "report"), ("LEADERRUN_FENCING_TOKEN", "12"), ("LEADERRUN_LEASE_FILE", "/run/x/lease")];
        let parent = || Source::Parent(PathBuf::from("/run/x/lease"));
        assert_eq!(resolve(None, None, None, env(&child)).unwrap(), (asked("report", 0), Some(12), parent()));
        let (_, token, _) = resolve(Some("report".into()), Some(11), None, env(&child)).unwrap();
        assert_eq!(token, Some(11), "a token given wins over the child's own");
        assert_eq!(
            resolve(Some("other".into()), None, None, env(&child)).unwrap(),
            (asked("other", 0), None, Source::Store)
        );
    }

    #[test]
    fn a_childs_own_slot_is_answered_from_the_parent_and_another_slot_from_the_store() {
        let child = [
            ("LEADERRUN_LOCK", "report"),
            ("LEADERRUN_SLOT", "2"),
            ("LEADERRUN_FENCING_TOKEN", "12"),
            ("LEADERRUN_LEASE_FILE", "/run/x/lease"),
        ];
        let parent = Source::Parent(PathBuf::from("/run/x/lease"));
        assert_eq!(resolve(None, None, None, env(&child)).unwrap(), (asked("report", 2), Some(12), parent));
        let (which, _, source) = resolve(None, None, Some(0), env(&child)).unwrap();
        assert_eq!((which, source), (asked("report", 0), Source::Store));
        let (which, _, source) = resolve(Some("other".into()), None, Some(1), env(&child)).unwrap();
        assert_eq!((which, source), (asked("other", 1), Source::Store));
    }

    #[test]
    fn outside_a_child_the_store_is_read_and_a_lock_is_needed() {
        assert_eq!(
            resolve(Some("l".into()), Some(3), None, env(&[])).unwrap(),
            (asked("l", 0), Some(3), Source::Store)
        );
        assert!(resolve(None, None, None, env(&[])).unwrap_err().contains("--lock"));
        let bad = [("LEADERRUN_LOCK", "l"), ("LEADERRUN_FENCING_TOKEN", "x"), ("LEADERRUN_LEASE_FILE", "/f")];
        assert!(resolve(None, None, None, env(&bad)).unwrap_err().contains("LEADERRUN_FENCING_TOKEN"));
    }
}
