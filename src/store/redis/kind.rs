//! The Redis store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::{RedisStore, Target};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "redis",
    schemes: &["redis", "rediss", "redis+sentinel", "rediss+sentinel"],
    usage: "redis://:pass@host:6379/0",
    url: "redis://[user]:pass@host:6379/0?prefix=leaderrun: (rediss:// for TLS), or through Sentinels: \
          redis+sentinel://[user]:pass@host:26379[,host2:26379...]/SERVICE[/0][?sentinel-password=PASS] \
          (rediss+sentinel:// for TLS)",
    help: "Lua scripts on one server (no Cluster); the lease is the key's PX expiry on the server's clock, the \
           fencing token an INCR counter; a release wakes the waiter blocked longest in BLPOP (one connection each). Redis loses keys on a restart \
           unless it runs with appendonly yes and appendfsync always. Replication is asynchronous: after a \
           failover (a new master_replid) nothing is granted until the longest lease asked for has passed, and \
           tokens jump above the old ones; a holder whose lease the replica lacked loses it. Through Sentinels \
           (redis+sentinel://, the URL's password is the servers', ?sentinel-user= and ?sentinel-password= the \
           Sentinels' own) the store asks them for the master again after any connection failure and checks \
           with ROLE that it is one. TLS: rediss:// with the system's CAs \
           or ?cacert=FILE, and a client certificate from &cert=FILE&key=FILE. A server whose maxmemory-policy \
           is not noeviction is refused (exit 69), whatever its maxmemory, as is one that shows its policy \
           through neither CONFIG GET nor INFO: it may evict a held lease (a second holder starts) or the token \
           counter (tokens repeat). ?allow-eviction=1 accepts that risk. The policy is read when a run starts: a \
           change under a running holder is not seen. A server whose scripts may not run INFO cannot show a \
           failover: leases are granted without the guard, as the run says once. The database is the path \
           (/2); ?protocol=resp3 is also taken; any other parameter is refused.",
    parse: |url| Target::parse(url).map(|target| Box::new(target) as Box<dyn StoreSpec>),
};

#[async_trait]
impl StoreSpec for Target {
    fn shown(&self) -> String {
        self.shown.clone()
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        Ok(Box::new(RedisStore::open(self, access).await?))
    }

    /// The lease is the key's PX expiry, on the server's clock.
    fn expiry_on_server_wall_clock(&self) -> bool {
        true
    }
}
