//! The Cloud Storage store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::Target;
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "gcs",
    schemes: &["gs"],
    usage: "gs://BUCKET/PREFIX",
    url: "gs://BUCKET[/PREFIX]",
    help: "Cloud Storage: one object per lock under PREFIX (default leaderrun/), named as on s3://; the record is the \
           object's custom metadata. Every write is a JSON API multipart upload with ifGenerationMatch=0 (create) or \
           the generation and metageneration read (replace); a run checks that the server honours it and refuses \
           one that does not. Credentials as Google's client libraries find them (GOOGLE_APPLICATION_CREDENTIALS, \
           gcloud auth application-default login, the metadata server); STORAGE_EMULATOR_HOST names an emulator. \
           Cloud Storage ends no lease: a standby takes a lock whose object it has seen unchanged for ttl x 1.02 + \
           100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the object frees the lock at once. \
           Fencing tokens follow the server's Date (seconds x 1,000,000), as on s3://. Google allows about one \
           write per second to one object: keep --renew-every at 1 s or more (--ttl 3s or more). A 401, 403 or \
           missing bucket exits 69.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        super::open(self, access).await
    }

    /// Client-timed: no lease is judged on any server's clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
