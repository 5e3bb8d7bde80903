//! End-to-end tests of the `leaderrun` binary against Azurite (one server per test): the shared
//! suite (tests/e2e/), where the Azure CLI's AZURE_STORAGE_CONNECTION_STRING finds the server,
//! and what only this store has: a --ttl outside Azure's 15-60 s refused before anything
//! connects, so is a prefix with dot segments, a missing container named (exit 69), runs with
//! a container SAS and a user delegation SAS, and -vvv that shows neither the key nor a SAS. The shared tests' short leases are 15 s here (`TestServer::short_ttl`), the shortest
//! Azure keeps.
//!
//! Fencing tokens follow the server's clock (seconds × 1,000,000), so they increase but do not
//! start at 1.

mod common;
mod e2e;
mod servers;

use common::*;
use e2e::Tokens;
use servers::azure_sas::{container_sas, sas_connection_string, user_delegation_sas};
use servers::azurite::{connection_string, Azurite, CONTAINER, KEY};
use servers::TestServer;

e2e_suite!(Azurite, tokens: Tokens::Rising, except {
    runs_over_mutual_tls: "Azurite is plain HTTP here",
});

/// A sandbox whose runs reach `server` through the connection string.
fn sandbox(server: &Azurite) -> Sandbox {
    Sandbox::new().with_envs(server.env())
}

#[test]
fn a_ttl_azure_cannot_keep_is_refused_before_connecting() {
    // Nothing listens on this port: a refusal that came from the store would exit 69.
    let closed = servers::free_port();
    let sb = Sandbox::new().with_env("AZURE_STORAGE_CONNECTION_STRING", &connection_string(closed, KEY));
    let url = Azurite::url_of("locks", "");
    let job = ["--", "sh", "-c", r#"touch "$D/ran""#];
    for (timing, says) in [
        (&["--ttl", "10s"][..], "--ttl 10s asks for a lease of 10s"),
        (&["--ttl", "61s"], "--ttl 1m 1s asks for a lease of 1m 1s"),
        (&["--ttl", "50s", "--lock-delay", "20s"], "--ttl 50s + --lock-delay 20s is a lease of 1m 10s"),
        (&["--lock-delay", "50s"], "--ttl 15s (the default) + --lock-delay 50s"),
    ] {
        let args = [&["--lock", "x"][..], timing, &job].concat();
        let out = sb.output(sb.at(&url, &args));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{timing:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        for part in [says, "azblob://devstoreaccount1/locks", "15s to 1m"] {
            assert!(err.contains(part), "{part:?} missing from {err:?}");
        }
    }
    // Inside the range, the same command gets as far as the (closed) port.
    let out = sb.output(sb.at(&url, &[&["--lock", "x", "--ttl", "20500ms", "--timeout", "1s"][..], &job].concat()));
    assert_eq!(out.status.code(), Some(69), "{}", stderr_of(&out));
    assert!(!sb.exists("ran"));
}

#[test]
fn a_missing_container_exits_69_naming_it() {
    let server = Azurite::start();
    let sb = sandbox(&server);
    let url = Azurite::url_of("no-such-container", "");
    for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"], &["list"]] {
        let out = sb.output(sb.at(&url, args));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains("the container \"no-such-container\" does not exist"), "{err:?}");
        assert!(!err.contains(KEY), "{err:?}");
    }
    assert!(!sb.exists("ran"));
}

/// -vvv with a SAS token: neither its signature nor the rest of it shows.
#[test]
fn verbose_output_never_shows_a_sas() {
    let server = Azurite::start();
    let sig = "c2lnbmF0dXJlLW5vdC1zaG93bg%3D%3D";
    let sas = format!("sv=2021-06-08&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00%3A00%3A00Z&sig={sig}");
    let connection =
        format!("BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1;SharedAccessSignature={sas}", server.port());
    let sb = Sandbox::new().with_env("AZURE_STORAGE_CONNECTION_STRING", &connection);
    // Azurite refuses the made-up signature: every command fails, and says so without it.
    for args in [&["-vvv", "--lock", "v", "--", "true"][..], &["status", "-vvv", "--lock", "v"], &["list", "-vvv"]] {
        let out = sb.output(sb.at(&server.url(), args));
        let all = format!("{}{}", stdout_of(&out), stderr_of(&out));
        assert_eq!(out.status.code(), Some(69), "{args:?}: {all}");
        assert!(all.contains("HTTP 403"), "{all}");
        assert!(!all.contains("c2lnbmF0dXJl") && !all.contains("se=2099"), "the SAS shows: {all}");
    }
}

/// A prefix with `.` or `..` segments, or a `\`, would be sent as another path than the one
/// signed (or reach another path with a SAS): refused in one line naming it, before anything
/// connects (nothing listens on the port: a refusal from the store would exit 69).
#[test]
fn a_prefix_with_dot_segments_exits_2_before_connecting() {
    let closed = servers::free_port();
    let sb = Sandbox::new().with_env("AZURE_STORAGE_CONNECTION_STRING", &connection_string(closed, KEY));
    for (prefix, named) in [("team/../other", "\"team/../other\""), ("./x", "\"./x\""), ("a%5Cb", "\"a\\\\b\"")] {
        let url = Azurite::url_of("locks", prefix);
        for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"], &["list"]]
        {
            let out = sb.output(sb.at(&url, args));
            let err = stderr_of(&out);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}: {err:?}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains(named) && err.contains("--store"), "{named} or --store missing from {err:?}");
        }
    }
    assert!(!sb.exists("ran"));
}

/// A run, `status` and `release` with a container SAS and with a user delegation SAS (both
/// `sr=c`, which may not read the container's own properties), as the Container Apps example
/// sets one up.
#[test]
fn a_run_with_a_container_or_user_delegation_sas() {
    let server = Azurite::start();
    for (lock, sas) in [
        ("container-sas", container_sas(CONTAINER, "racwl", KEY)),
        ("user-delegation-sas", user_delegation_sas(CONTAINER, "racwl")),
    ] {
        let sb =
            Sandbox::new().with_env("AZURE_STORAGE_CONNECTION_STRING", &sas_connection_string(server.port(), &sas));
        let out = sb.output(sb.at(&server.url(), &["--lock", lock, "--", "sh", "-c", r#"touch "$D/ran""#]));
        assert_eq!(out.status.code(), Some(0), "{lock}: {}", stderr_of(&out));
        assert!(sb.exists("ran"), "{lock}: the command did not run");
        // Kept for --min-hold (10 s by default): `status` shows it, `release` ends the keep.
        for args in [&["status", "--lock", lock][..], &["release", "--lock", lock]] {
            let out = sb.output(sb.at(&server.url(), args));
            assert_eq!(out.status.code(), Some(0), "{lock} {args:?}: {}", stderr_of(&out));
        }
        let out = sb.output(sb.at(&server.url(), &["--lock", lock, "--", "sh", "-c", r#"touch "$D/again""#]));
        assert_eq!(out.status.code(), Some(0), "{lock}: {}", stderr_of(&out));
        assert!(sb.exists("again"), "{lock}: a released keep still held the lock");
    }
}
