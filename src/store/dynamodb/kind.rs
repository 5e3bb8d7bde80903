//! The DynamoDB store as the registry lists it: its scheme and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::Target;
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "dynamodb",
    schemes: &["dynamodb"],
    usage: "dynamodb://TABLE",
    url: "dynamodb://TABLE",
    help: "One item per lock in TABLE (partition key `key`, the lock name), its attributes named as awslabs' \
           DynamoDB lock client names them (ownerName, leaseDuration, recordVersionNumber, isReleased). Writes are \
           PutItem conditional on the item's recordVersionNumber (a random UUID each write replaces); reads are \
           strongly consistent. `leaderrun init` makes the table (on-demand billing; `--print` shows the AWS CLI \
           command); a missing table exits 69. A global table (one with replicas) is refused: its regions \
           replicate last-writer-wins. Credentials, region and endpoint as the AWS CLI finds them. DynamoDB ends no \
           lease: a standby takes a lock whose item it has seen unchanged for ttl x 1.02 + 100 ms, a waiting \
           standby reads it every 1 to 1.5 s, and deleting the item frees the lock at once. Fencing tokens follow \
           the server's Date (seconds x 1,000,000), so they outlive a deleted item.",
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

    async fn prepare(&self) -> Result<Box<dyn Store>> {
        super::prepare_with(self, |loader| loader).await
    }

    fn setup_text(&self) -> Option<String> {
        Some(super::create_command(self))
    }

    /// Client-timed: no lease is judged on any server's clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
