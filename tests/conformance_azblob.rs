//! The conformance suite against Azurite (one server per test, keeping its blobs on disk so
//! that leases survive a restart), and what only this store has: a missing container named,
//! a wrong key and a bad SAS refused in one line without them, an account SAS, a container
//! SAS and a user delegation SAS that work, tokens that outlive a deleted blob, a revoke that
//! keeps everyone out until the holder lets go or the lease would have expired, a keep judged
//! on the server's clock, and a keep that a renewal's metadata write landing after it does
//! not erase.
//!
//! Each client is given its connection string (in-process clients cannot each have an
//! environment of their own; the end-to-end tests set AZURE_STORAGE_CONNECTION_STRING).

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance::{held, unique, won, Harness, SOON, TTL};
use leaderrun::store::azblob::{AzBlobStore, Target};
use leaderrun::store::{Access, Acquire, ErrorKind, Renew, Store, StoreError};
use servers::azure_sas::{account_sas, container_sas, sas_connection_string, user_delegation_sas};
use servers::azurite::{connection_string, Azurite, ACCOUNT, CONTAINER, KEY, WRONG_KEY};
use servers::gate::Gate;
use servers::TestServer;

struct Az {
    server: Azurite,
}

async fn az() -> Az {
    Az { server: tokio::task::spawn_blocking(Azurite::start).await.unwrap() }
}

async fn open(url: &str, connection: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    let target = Target::parse(url).expect("a valid URL");
    Ok(Arc::new(AzBlobStore::open_with(&target, access, connection).await?))
}

impl Az {
    async fn store(&self) -> AzBlobStore {
        let target = Target::parse(&Azurite::url_of(CONTAINER, "")).unwrap();
        AzBlobStore::open_with(&target, Access::Create, &self.server.connection_string()).await.unwrap()
    }
}

#[async_trait]
impl Harness for Az {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(self.store().await)
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(az());

/// One line, the kind, what it must say, and none of the secrets.
fn assert_refusal(err: &StoreError, needle: &str, secrets: &[&str]) {
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
    assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    for secret in secrets {
        assert!(!err.message.contains(secret), "a secret shows: {:?}", err.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_container_is_refused_by_name() {
    let az = az().await;
    let url = Azurite::url_of("no-such-container", "");
    let err = open(&url, &az.server.connection_string(), Access::Create).await.err().expect("opened");
    assert_refusal(&err, "the container \"no-such-container\" does not exist", &[KEY]);
    // `status` opens without the check: its read names the container all the same.
    let store = open(&url, &az.server.connection_string(), Access::Existing).await.unwrap();
    assert_refusal(&store.status("x").await.unwrap_err(), "\"no-such-container\" does not exist", &[KEY]);
    assert_refusal(&store.acquire("x", "a", TTL).await.unwrap_err(), "does not exist", &[KEY]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_key_is_refused_in_one_line_without_it() {
    let az = az().await;
    let wrong = connection_string(az.server.port(), WRONG_KEY);
    let url = Azurite::url_of(CONTAINER, "");
    let err = open(&url, &wrong, Access::Create).await.err().expect("opened with a wrong key");
    assert_refusal(&err, "HTTP 403", &[KEY, WRONG_KEY]);
    let store = open(&url, &wrong, Access::Existing).await.unwrap();
    assert_refusal(&store.acquire("x", "a", TTL).await.unwrap_err(), "HTTP 403", &[KEY, WRONG_KEY]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sas_token_works_and_a_bad_one_is_refused_without_it() {
    let az = az().await;
    let endpoint = format!("BlobEndpoint=http://127.0.0.1:{}/{ACCOUNT}", az.server.port());
    let url = Azurite::url_of(CONTAINER, "sas");
    let sas = account_sas("rwdlac", KEY);
    let with_sas = format!("{endpoint};SharedAccessSignature={sas}");
    let (a, b) =
        (open(&url, &with_sas, Access::Create).await.unwrap(), open(&url, &with_sas, Access::Create).await.unwrap());
    let lock = unique("sas");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    assert!(b.list().await.unwrap().iter().any(|r| r.lock == lock));
    a.release(&lease, Duration::ZERO).await.unwrap();
    won(&*b, &lock, "b", TTL).await;

    let forged = account_sas("rwdlac", WRONG_KEY);
    let sig = forged.split("sig=").nth(1).unwrap().to_string();
    let err = open(&url, &format!("{endpoint};SharedAccessSignature={forged}"), Access::Create).await.err().unwrap();
    assert_refusal(&err, "HTTP 403", &[&sig, KEY]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_outlive_a_deleted_blob() {
    let az = az().await;
    let (store, admin) = (az.store().await, az.store().await);
    let lock = unique("deleted");
    let mut last = 0;
    for round in 0..3 {
        let lease = won(&store, &lock, &format!("holder-{round}"), TTL).await;
        assert!(lease.token > last, "token {} after {last}", lease.token);
        last = lease.token;
        // Deleted under its holder (the lease broken first, as an operator would), then again
        // after a release: both times the next token is larger.
        if round == 1 {
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        admin.delete(&lock).await.unwrap();
        assert_eq!(admin.status(&lock).await.unwrap().token, 0, "the blob is gone");
        assert!(matches!(store.renew(&lease, TTL).await.unwrap(), Renew::Lost(_)));
    }
}

/// A revoke keeps everyone out until the holder releases (it has stopped its child): its
/// renewal is lost, a release of the breaking lease frees it at once. Without the holder's
/// release the lock opens when the lease would have expired, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoke_keeps_everyone_out_until_the_holder_lets_go_or_the_lease_ends() {
    let az = az().await;
    let (a, admin, b) = (az.store().await, az.store().await, az.store().await);
    let lock = unique("revoke");
    let lease = won(&a, &lock, "a", Duration::from_secs(15)).await;
    let before = admin.revoke(&lock).await.unwrap().expect("held");
    assert_eq!((before.holder.as_deref(), before.revoked), (Some("a"), false));
    assert!(admin.status(&lock).await.unwrap().revoked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    held(&b, &lock, "b").await;
    match a.renew(&lease, TTL).await.unwrap() {
        Renew::Lost(Some(record)) => assert!(record.revoked && record.holder.as_deref() == Some("a"), "{record:?}"),
        other => panic!("a revoked lease was renewed: {other:?}"),
    }
    a.release(&lease, Duration::ZERO).await.unwrap();
    let next = won(&b, &lock, "b", Duration::from_secs(15)).await;
    assert!(next.token > lease.token);

    // b never lets go: the lock opens when b's lease would have ended.
    let taken = Instant::now();
    admin.revoke(&lock).await.unwrap().expect("held");
    loop {
        match a.acquire(&lock, "a", TTL).await.unwrap() {
            Acquire::Won(_) => break,
            Acquire::Held(record) => assert!(record.revoked, "{record:?}"),
            other => panic!("{other:?}"),
        }
        assert!(taken.elapsed() < SOON, "a broken lease never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(taken.elapsed() >= Duration::from_secs(14), "opened {:?} into a 15 s lease", taken.elapsed());
}

/// A keep has no lease: acquirers that find it let go of the lease they took, and it ends on
/// the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_lock_stays_taken_until_the_keep_ends() {
    let az = az().await;
    let (a, b) = (az.store().await, az.store().await);
    let lock = unique("kept");
    let lease = won(&a, &lock, "a", TTL).await;
    a.release(&lease, Duration::from_secs(4)).await.unwrap();
    for _ in 0..3 {
        match b.acquire(&lock, "b", TTL).await.unwrap() {
            Acquire::Held(record) => assert!(record.kept && record.holder.as_deref() == Some("a"), "{record:?}"),
            other => panic!("a kept lock was taken: {other:?}"),
        }
    }
    let status = b.status(&lock).await.unwrap();
    assert!(status.kept && status.expires_in.unwrap() <= Duration::from_secs(4), "{status:?}");
    assert!(matches!(a.renew(&lease, TTL).await.unwrap(), Renew::Lost(_)), "a kept lease is not renewed");
    let started = Instant::now();
    loop {
        if let Acquire::Won(next) = b.acquire(&lock, "b", TTL).await.unwrap() {
            assert!(next.token > lease.token);
            break;
        }
        assert!(started.elapsed() < SOON, "the keep never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Azure takes leases of 15 to 60 s: a shorter one is asked for 15 s (longer is safe), a
/// longer one is refused as unfit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_longer_than_azure_keeps_are_refused() {
    let az = az().await;
    let store = az.store().await;
    let err = store.acquire(&unique("long"), "a", Duration::from_secs(61)).await.unwrap_err();
    assert!(err.kind == ErrorKind::Unfit && err.message.contains("15 to 60 s"), "{err:?}");
    let lease = won(&store, &unique("short"), "a", Duration::from_millis(1500)).await;
    // A 15 s lease, read a second or two later (a new blob's token waits out its second).
    let left = store.status(&lease.lock).await.unwrap().expires_in.expect("held");
    assert!(left > Duration::from_secs(10), "{left:?} left of a lease asked for 1.5 s");
}

/// A container SAS and a user delegation SAS (both `sr=c`, what the docs and the Container
/// Apps example recommend) reach only the container's blobs, not the container itself: a run
/// opens with either, takes, renews, lists, revokes and releases, and a missing container is
/// still named. A SAS without read is refused in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_sas_and_a_user_delegation_sas_start_a_run() {
    let az = az().await;
    let url = Azurite::url_of(CONTAINER, "scoped");
    let sas_for = |kind: &str, container: &str| match kind {
        "container" => container_sas(container, "racwl", KEY),
        _ => user_delegation_sas(container, "racwl"),
    };
    for kind in ["container", "user delegation"] {
        let connection = sas_connection_string(az.server.port(), &sas_for(kind, CONTAINER));
        let a = open(&url, &connection, Access::Create).await.unwrap_or_else(|e| panic!("{kind} SAS: {}", e.message));
        let (b, admin) = (open(&url, &connection, Access::Create).await.unwrap(), az.store().await);
        let lock = unique("scoped");
        let lease = won(&*a, &lock, "a", TTL).await;
        held(&*b, &lock, "b").await;
        assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed, "{kind} SAS");
        assert!(b.list().await.unwrap().iter().any(|r| r.lock == lock), "{kind} SAS lists");
        assert!(b.revoke(&lock).await.unwrap().is_some(), "{kind} SAS revokes");
        assert!(matches!(a.renew(&lease, TTL).await.unwrap(), Renew::Lost(_)), "{kind} SAS: a revoked lease");
        a.release(&lease, Duration::ZERO).await.unwrap();
        let next = won(&*b, &lock, "b", TTL).await;
        assert!(next.token > lease.token);
        b.release(&next, Duration::ZERO).await.unwrap();
        assert!(!admin.status(&lock).await.unwrap().is_held());

        let elsewhere = sas_connection_string(az.server.port(), &sas_for(kind, "no-such-container"));
        let missing = Azurite::url_of("no-such-container", "");
        let err = open(&missing, &elsewhere, Access::Create).await.err().expect("a missing container opened");
        assert_refusal(&err, "the container \"no-such-container\" does not exist", &[KEY]);
    }
    let unreadable = container_sas(CONTAINER, "acwl", KEY);
    let sig = unreadable.split("sig=").nth(1).unwrap().to_string();
    let err = open(&url, &sas_connection_string(az.server.port(), &unreadable), Access::Create).await.err();
    assert_refusal(&err.expect("opened with a SAS that cannot read"), "HTTP 403", &[&sig, KEY]);
}

/// A renewal notes its time in the metadata after Renew Lease; a release with --min-hold writes
/// its keep there just before Release Lease. A renewal's write that lands between the two (here
/// a second client of the same identity, whose requests a gate holds in that order) must not
/// erase the keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewals_metadata_write_never_erases_a_keep() {
    let az = az().await;
    let (releasing, renewing) = (Gate::start(az.server.port()), Gate::start(az.server.port()));
    let url = Azurite::url_of(CONTAINER, "");
    let a = open(&url, &connection_string(releasing.port(), KEY), Access::Create).await.unwrap();
    let a_too = open(&url, &connection_string(renewing.port(), KEY), Access::Create).await.unwrap();
    let b = az.store().await;
    let lock = unique("renew-keep");
    let lease = won(&*a, &lock, "a", TTL).await;

    renewing.arm("comp=metadata");
    let renewal = tokio::spawn({
        let (a_too, lease) = (a_too.clone(), lease.clone());
        async move { a_too.renew(&lease, TTL).await }
    });
    tokio::task::block_in_place(|| renewing.wait_held());
    releasing.arm("x-ms-lease-action: release");
    let release = tokio::spawn({
        let (a, lease) = (a.clone(), lease.clone());
        async move { a.release(&lease, Duration::from_secs(60)).await }
    });
    tokio::task::block_in_place(|| releasing.wait_held());
    renewing.open();
    assert_eq!(renewal.await.unwrap().unwrap(), Renew::Renewed);
    releasing.open();
    release.await.unwrap().unwrap();

    match b.acquire(&lock, "b", TTL).await.unwrap() {
        Acquire::Held(record) => assert!(record.kept && record.holder.as_deref() == Some("a"), "{record:?}"),
        other => panic!("the renewal's metadata write erased the keep: {other:?}"),
    }
}

/// A renewal still shows in `status` (its time is written, guarded by the blob's ETag): a lease
/// renewed 4 s into its 15 s shows more than 11 s left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_shows_in_status() {
    let az = az().await;
    let (a, b) = (az.store().await, az.store().await);
    let lock = unique("renewed");
    let ttl = Duration::from_secs(15);
    let lease = won(&a, &lock, "a", ttl).await;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(a.renew(&lease, ttl).await.unwrap(), Renew::Renewed);
        let left = b.status(&lock).await.unwrap().expires_in.expect("held");
        assert!(left > Duration::from_secs(11), "{left:?} left just after a renewal of a 15 s lease");
    }
}
