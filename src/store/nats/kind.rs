//! The NATS store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use std::time::Duration;

use async_trait::async_trait;

use super::{NatsStore, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "nats",
    schemes: &["nats"],
    usage: "nats://user:pass@host:4222/BUCKET",
    url: "nats://[user:pass@|token@]host:4222[,host2:4222...][/BUCKET][?replicas=N&creds=FILE&tls=1&tlsca=FILE]",
    help: "One key per lock in a JetStream KV bucket (default leaderrun, created with per-message TTL); writes are \
           compare-and-sets on the key's last revision, the fencing token is the acquiring write's revision \
           (tokens grow but not by one), the lease a Nats-TTL rounded up to seconds, waiters watch the key, and a queue group on its subject picks the one that tries first at a release (the others \
           try 100–300 ms later if nobody has). The \
           value is the holder's identity, as Choria writes it: with /CHORIA_LEADER_ELECTION, Choria's tools show \
           the leaderrun holder, and deleting the key (Choria's evict) stops it at its next renewal. In a bucket \
           without per-message TTL (Choria's) leaderrun wins as Choria does: it waits one campaign interval \
           (0.75 x max age) + 200 ms and confirms with an update before the child starts, and its --ttl is at \
           most that interval + 200 ms, so evicted holders never overlap standbys; --min-hold is at most the max \
           age. A --ttl that does not fit is refused (status 2; without --ttl, a run picks one that fits). Needs \
           jetstream { \
           sync_interval: always } to keep acknowledged writes across a crash, and replicas=3 in a cluster; expiry \
           follows the server's wall clock. In a cluster a run keeps two connections, to two servers, and sends \
           a request again over the other when one hangs; the bucket stream's leader election after a crash \
           takes 4-14 s, so the defaults there are --ttl 35s, --min-hold 30s and a 15 s one-shot retry.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(NatsStore::open(self, access).await?))
    }

    /// A bucket asked for with `?replicas=` above 1 has a stream leader election to ride out.
    fn known_failover(&self) -> Duration {
        self.failover().unwrap_or_default()
    }

    /// A message's TTL follows the server's wall clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        true
    }
}
