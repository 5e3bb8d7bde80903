//! The Kubernetes store as the registry lists it: its schemes and help, and what the run
//! knows of its URL before it connects.

use async_trait::async_trait;

use super::Target;
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

pub const KIND: StoreKind = StoreKind {
    name: "kubernetes",
    schemes: &["k8s", "kubernetes"],
    usage: "k8s://NAMESPACE",
    url: "k8s://[NAMESPACE][?context=NAME]",
    help: "Also kubernetes://. One coordination.k8s.io/v1 Lease per lock, written as client-go's LeaseLock writes \
           it (holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions; leaderrun's own \
           fields in leaderrun.dev/ annotations), so kubectl and client-go electors see and respect it. The \
           cluster and credentials are kubectl's: $KUBECONFIG or ~/.kube/config (its current context, or \
           ?context=), else the pod's service account; the namespace is the context's (or the pod's) unless \
           named. Writes carry the Lease's resourceVersion and uid; waiters watch the Lease. The API server \
           expires nothing: a standby takes a held Lease only after seeing it unchanged for ttl*(1+2*drift) + \
           margin on its own clock (after a crash, takeover takes that long from the last renewal it saw; a \
           one-shot run that finds a Lease it has not seen before may watch it that long, bounded by --timeout), \
           and at once when it was released. The fencing token is above every resourceVersion before the \
           acquisition (an etcd revision: tokens grow but not by one). kubectl delete lease frees the lock at \
           once; its holder notices at its next renewal. RBAC: get, list, watch, create and update on leases. A \
           lock name that is not a valid object name becomes leaderrun-sha256-HEX, the name in an annotation.",
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

    /// Client-timed: the API server expires nothing.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}
