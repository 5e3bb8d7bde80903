//! Does this server honour `baseVersion`? Every renewal's commit carries one, and a server
//! that ignored it would be trusted to detect conflicts it does not. The Firestore emulator
//! in Datastore mode (`gcloud emulators firestore start --database-mode=datastore-mode`) is
//! such a server: it applies a stale `baseVersion` update without a word. So a run (not
//! `status` or `list`) asks first, on an entity of its own (`KIND/.leaderrun-probe-RANDOM`,
//! which `list` skips):
//!
//! 1. insert it (NON_TRANSACTIONAL): version V;
//! 2. update it with `baseVersion` ≠ V: the answer must say `conflictDetected`;
//! 3. delete it.
//!
//! Three small writes per run; a server that fails the check is refused at open, in one line.

use serde_json::json;

use super::api::{Answer, Api};
use super::entity::{entity, number};
use crate::store::client_timed::Record;
use crate::store::{Result, StoreError};

/// Probe entities' names start with this; `list` skips them.
pub const PROBE_PREFIX: &str = ".leaderrun-probe-";

/// Refuse a server that is seen to ignore `baseVersion`.
pub async fn check_base_version(api: &Api) -> Result<()> {
    let name = format!("{PROBE_PREFIX}{:016x}", rand::random::<u64>());
    let key = api.place.key(&name);
    let shown = api.place.shown(&name);
    let record = Record { holder: "leaderrun checks that baseVersion is honoured".into(), ..Record::default() };
    let insert = json!({"mode": "NON_TRANSACTIONAL", "mutations": [{"insert": entity(key.clone(), &record).0}]});
    let inserted = api.call_ok("commit", &format!("{shown} (insert)"), insert).await?;
    let version = number(&inserted["mutationResults"][0]["version"])
        .ok_or_else(|| StoreError::refused(format!("{}: commit {shown}: no version in the answer", api.shown)))?;
    let stale = if version > 1 { version - 1 } else { version + 1 };
    let update = json!({"mode": "NON_TRANSACTIONAL", "mutations": [{
        "update": entity(key.clone(), &record).0, "baseVersion": stale.to_string()}]});
    let answer = api.call("commit", &format!("{shown} (update, stale baseVersion)"), update).await;
    let delete = json!({"mode": "NON_TRANSACTIONAL", "mutations": [{"delete": key}]});
    if let Err(err) = api.call("commit", &format!("{shown} (delete)"), delete).await {
        tracing::debug!("{}", err.message);
    }
    match answer? {
        Answer::Ok(done) if done["mutationResults"][0]["conflictDetected"] == json!(true) => Ok(()),
        // Refused outright (a conflict reported as an error): honoured too.
        Answer::Failed(failure) if failure.code == "ABORTED" => Ok(()),
        Answer::Failed(failure) => Err(failure.into_error()),
        Answer::Ok(_) => Err(StoreError::refused(format!(
            "{}: this server ignores baseVersion (an update of {shown} with a stale one was applied), so it \
             cannot tell a renewal from a lost race: the Firestore emulator in Datastore mode does this; use the \
             Datastore emulator (gcloud beta emulators datastore start) or Datastore itself",
            api.shown
        ))),
    }
}
