//! Does this server honour `ifGenerationMatch` on uploads? A server that ignored it would
//! let two hosts both "win" a lock, silently. So a run (not `status` or `list`) asks first,
//! on objects of its own (lock names never start with a `.`), through the very upload the
//! store writes locks with (multipart):
//!
//! 1. Upload `PREFIX.conditional-write-probe` with `ifGenerationMatch=0`: 412 once that
//!    object exists. The first time ever it is created (200) and asked again, which must
//!    then be 412. A 404 here can only mean that the bucket is missing: refused.
//! 2. Upload `PREFIX.conditional-write-probe-RANDOM` (an object that does not exist) with
//!    `ifGenerationMatch=1`, a generation no object has: must be refused (412, or 404). A
//!    200 means the server ignores the precondition; the object it wrote is deleted again.
//!
//! Two refused uploads per run (Class A operations; three the first time). A server that
//! fails either check is refused at open, in one line. fake-gcs-server 1.54 passes (it
//! honours preconditions on multipart uploads only, which is all the store uses).

use super::api::{Bucket, Precondition, Upload};
use crate::store::{Result, StoreError};

/// The probe object's name under `prefix`.
pub fn probe_name(prefix: &str) -> String {
    format!("{prefix}.conditional-write-probe")
}

const CONTENT: &[u8] = b"leaderrun checks that conditional writes are honoured\n";

async fn upload(bucket: &Bucket, name: &str, generation: u64) -> Result<Upload> {
    let precondition = Precondition { generation, metageneration: None };
    Ok(bucket.upload(name, None, CONTENT, "text/plain", precondition).await?.0)
}

/// Refuse a server that is seen to ignore `ifGenerationMatch`, and a missing bucket.
pub async fn check_conditional_writes(bucket: &Bucket, prefix: &str) -> Result<()> {
    let name = probe_name(prefix);
    let ignores = |condition: &str| {
        StoreError::refused(format!(
            "gs://{}: this server ignores {condition} on uploads (checked on {name}), so two hosts could both \
             take a lock: leaderrun needs a Cloud Storage server that honours preconditions",
            bucket.name
        ))
    };
    let missing =
        || StoreError::refused(format!("gs://{}: the bucket does not exist (checked on {name})", bucket.name));
    match upload(bucket, &name, 0).await? {
        Upload::Precondition => {}
        Upload::NotFound => return Err(missing()),
        // Created just now (the first run against this prefix), or ignored: ask again.
        Upload::Written(_) => match upload(bucket, &name, 0).await? {
            Upload::Precondition => {}
            Upload::NotFound => return Err(missing()),
            Upload::Written(_) => return Err(ignores("ifGenerationMatch=0")),
        },
    }
    let absent = format!("{name}-{:016x}", rand::random::<u64>());
    if let Upload::Written(_) = upload(bucket, &absent, 1).await? {
        let _ = bucket.delete(&absent).await;
        return Err(ignores("ifGenerationMatch"));
    }
    Ok(())
}
