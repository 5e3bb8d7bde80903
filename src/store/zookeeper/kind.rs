//! The ZooKeeper store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{Target, ZooKeeperStore};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "zookeeper",
    schemes: &["zk", "zookeeper"],
    usage: "zk://host:2181",
    url: "zk://[user:pass@]host:2181[,host2:2181...][/path][?tls=1&cacert=FILE]",
    help: "Also zookeeper://. The lease is a ZooKeeper session whose timeout is the ttl (+ --lock-delay) + 25% + the servers' tick \
           (at most half the timeout they grant a 4 s session): an ephemeral sequential child of the lock's node, \
           the lowest child holding it; the fencing token is its sequence number + 1. Expiry is judged by the \
           ZooKeeper leader; a --ttl whose session the server's maxSessionTimeout does not allow is refused \
           (without --ttl, a run picks one that fits, with its --lock-delay). Renewals sync and read the child on its own session; \
           waiters queue, each watching only the one ahead of it (the first, the holder's child). user:pass is the digest scheme, with creator-only ACLs. --min-hold is \
           judged on wall clocks. Never delete the lock nodes by hand. In an ensemble a session leaves a \
           server that stops answering within a tenth of its timeout. TLS: ?tls=1&cacert=FILE (the \
           secureClientPort), and a client certificate from &cert=FILE&key=FILE.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(ZooKeeperStore::open(self, access).await?))
    }

    /// Sessions are expired by the ZooKeeper leader's own timer.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
