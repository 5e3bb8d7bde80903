//! The Datastore store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{check_lock_name, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "datastore",
    schemes: &["datastore"],
    usage: "datastore://PROJECT/NAMESPACE",
    url: "datastore://PROJECT[/NAMESPACE][?kind=Lease&database=ID]",
    help: "Datastore, or Firestore in Datastore mode (the same API; Firestore in Native mode is refused). One \
           entity per lock in the namespace (default: the default namespace), of kind Lease unless ?kind= names \
           another, its key name the lock name (names like __x__ are reserved by Datastore and refused); \
           ?database= names a database other than the default. Credentials are Application Default Credentials \
           (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, the metadata server); \
           DATASTORE_EMULATOR_HOST=host:port points at an emulator. A create is an insert; a renewal reads the \
           entity in a transaction and commits it only if it is unchanged (version and a random nonce, with \
           baseVersion as well): a run checks and refuses a server that ignores baseVersion (the Firestore \
           emulator does). Datastore ends no lease: a standby takes a lock whose entity it has seen unchanged for \
           ttl x 1.02 + 100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the entity frees the lock \
           at once. Fencing tokens follow the entity versions, which only grow, so they outlive a deleted entity. \
           --min-hold is judged on the server's read time (the emulator has none: this host's clock). 401 and 403 \
           exit 69.",
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

    fn check_lock_name(&self, lock: &str) -> std::result::Result<(), String> {
        check_lock_name(lock)
    }

    /// Client-timed: no lease is judged on any server's clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
