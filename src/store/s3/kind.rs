//! The S3 store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::Target;
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "s3",
    schemes: &["s3"],
    usage: "s3://BUCKET/PREFIX",
    url: "s3://BUCKET[/PREFIX][?path-style=1]",
    help: "One object per lock under PREFIX (default leaderrun/), its key the lock name with %, / and a leading . \
           percent-encoded; its body a small JSON record. Writes are PutObject with If-None-Match: * (create) and \
           If-Match: ETAG (replace), so the server must honour conditional writes (AWS S3 does since 2024; a run \
           checks and refuses a server that ignores them). Credentials, region and endpoint as the AWS CLI finds \
           them (AWS_* variables, AWS_PROFILE and ~/.aws, web identity, ECS, instance metadata); path-style \
           addressing when an endpoint is set. S3 ends no lease: a standby takes a lock whose object it has seen \
           unchanged for ttl x 1.02 + 100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the object \
           frees the lock at once. Fencing tokens follow the server's Date (seconds x 1,000,000), so they outlive a \
           deleted object. A 403 exits 69.",
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
