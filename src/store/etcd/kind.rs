//! The etcd store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{EtcdStore, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "etcd",
    schemes: &["etcd", "etcds"],
    usage: "etcd://host:2379",
    url: "etcd://[user:pass@]host:2379[,host2:2379...][/prefix] (etcds:// for TLS)",
    help: "A lease plus a transaction on the key's create revision (the fencing token: etcd's global revision, \
           so tokens grow but not by one); renewals are keep-alives; waiters queue, and at a release the first in line tries first. Linearizable \
           through the Raft leader; leases last at least 2 s (etcd's minimum). List every member: a request goes \
           to a member that answers and is not busy with this run, a copy to the next when it hangs, so a \
           member's loss costs no lease at a --ttl of 11s or more. TLS: etcds:// (or ?tls=1) with the \
           system's CAs or ?cacert=FILE, and a client certificate from &cert=FILE&key=FILE.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(EtcdStore::open(self, access).await?))
    }

    /// Leases are timed by the Raft leader's monotonic clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
