//! The Azure Blob store as the registry lists it: its scheme and help, and what the run
//! knows of its URL before it connects (the lease durations Azure takes).

use std::ops::RangeInclusive;
use std::time::Duration;

use async_trait::async_trait;

use super::Target;
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store};

/// The lease durations Azure takes: 15 to 60 s (or infinite, which leaderrun never asks for).
pub const LEASE_LIMITS: RangeInclusive<Duration> = Duration::from_secs(15)..=Duration::from_secs(60);

pub const KIND: StoreKind = StoreKind {
    name: "azblob",
    schemes: &["azblob"],
    usage: "azblob://ACCOUNT/CONTAINER/PREFIX",
    url: "azblob://ACCOUNT/CONTAINER[/PREFIX]",
    help: "One blob per lock under PREFIX (default leaderrun/), leased with the blob's own lease, which the \
           server ends: Azure takes leases of 15 to 60 s, so --ttl + --lock-delay must fit that (whole \
           seconds, rounded up), else the run is refused. The fencing token is kept in the blob's metadata, \
           written under the lease, and follows the server's Date (seconds x 1,000,000), so it outlives a \
           deleted blob. `leaderrun release` breaks the lease: nobody may take it until it would have expired \
           or its holder, having stopped its child, releases it. Credentials and endpoint as the Azure CLI \
           finds them: AZURE_STORAGE_CONNECTION_STRING (its BlobEndpoint too: Azurite), AZURE_STORAGE_KEY or \
           AZURE_STORAGE_SAS_TOKEN; Microsoft Entra ID is not supported. A standby reads the blob every 1 to \
           1.5 s. The container must exist (else exit 69); nothing but blobs is created.",
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

    /// Azure's servers end a lease: how they time it is not documented, so a failover between
    /// them is treated as one between servers whose wall clocks may differ.
    fn expiry_on_server_wall_clock(&self) -> bool {
        true
    }

    fn lease_limits(&self) -> Option<RangeInclusive<Duration>> {
        Some(LEASE_LIMITS)
    }
}
