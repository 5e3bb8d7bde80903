//! End-to-end tests of the `leaderrun` binary against the test Kubernetes API server (one
//! per test): the shared suite (tests/e2e/), where a kubeconfig named by KUBECONFIG finds the
//! server; and what only this store has: kubectl reading and evicting a holder, refused
//! credentials, and a real client-go-style elector (the Python `kubernetes` client's) sharing
//! the lock.
//!
//! Here each sandbox's HOME holds the kubeconfig (~/.kube/config), as a user's would.

mod common;
mod e2e;
mod servers;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use e2e::Tokens;
use servers::kubernetes::{KubeApiServer, NAMESPACE, WRONG_TOKEN};

e2e_suite!(KubeApiServer, tokens: Tokens::Rising, except {
    runs_over_mutual_tls: "every test here is over TLS (the kubeconfig's CA), and clients sign in with a token, not a certificate",
});

const URL: &str = "k8s://";

/// A sandbox whose HOME has `kubeconfig` as ~/.kube/config (and no $KUBECONFIG inherited
/// from whoever runs the tests: it would point leaderrun at their cluster).
fn sandbox_with(kubeconfig: &Path) -> Sandbox {
    static NO_KUBECONFIG: std::sync::Once = std::sync::Once::new();
    // Safe enough: std serialises its own environment access, and nothing else here reads it.
    NO_KUBECONFIG.call_once(|| std::env::remove_var("KUBECONFIG"));
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("home/.kube")).unwrap();
    std::fs::copy(kubeconfig, sb.file("home/.kube/config")).unwrap();
    sb
}

fn started() -> (KubeApiServer, Sandbox) {
    let server = KubeApiServer::start();
    let sb = sandbox_with(&server.kubeconfig());
    (server, sb)
}

/// kubectl sees who holds the lock, and `kubectl delete lease` evicts the holder at its next
/// renewal (its child is stopped; exit 75); the next holder's token is larger.
#[test]
fn kubectl_reads_the_holder_and_evicts_it() {
    let (server, sb) = started();
    let script = r#"echo "$LEADERRUN_IDENTITY" > "$D/identity"
        echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "billing", "--wait", "--ttl", "20s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(URL, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let identity = sb.read("identity").trim().to_string();
    let shown = server.kubectl_ok(&["get", "lease", "billing", "-o", "jsonpath={.spec.holderIdentity}"]);
    assert_eq!(shown, identity);
    let table = server.kubectl_ok(&["get", "leases"]);
    assert!(table.contains("billing"), "{table}");
    let (_, before) = status_json(&sb, URL, "billing");

    server.kubectl_ok(&["delete", "lease", "billing"]);
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "the lease is lost; stderr {:?}", holder.stderr());
    assert!(!pid_alive(child), "the child must be stopped");
    assert!(!server.kubectl(&["get", "lease", "billing"]).status.success(), "the evicted holder re-created it");
    let out = sb
        .output(sb.at(URL, &["--lock", "billing", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let next: u64 = sb.read("next").trim().parse().unwrap();
    assert!(next > before["fencing_token"].as_u64().unwrap(), "{next} after {before}");
    assert!(!holder.stderr().contains(server.token()), "{:?}", holder.stderr());
}

/// A token the server does not know (401) and one RBAC denies (403): exit 69 before any
/// child starts, one line that names what was denied, and never the token.
#[test]
fn refused_credentials_exit_69_in_one_line_without_the_token() {
    let server = KubeApiServer::start();
    for (kubeconfig, needles) in [
        (server.wrong_kubeconfig(), &["401", "credentials"][..]),
        (server.denied_kubeconfig(), &["403", "RBAC denies get", "leases", NAMESPACE][..]),
    ] {
        let sb = sandbox_with(&kubeconfig);
        for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"][..]] {
            let out = sb.output(sb.at(URL, args));
            let (err, stdout) = (stderr_of(&out), stdout_of(&out));
            assert_eq!(out.status.code(), Some(69), "{args:?}: stderr {err:?}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            for needle in needles {
                assert!(err.contains(needle), "{needle:?} missing from {err:?}");
            }
            for token in [server.token(), server.denied_token(), WRONG_TOKEN] {
                assert!(!err.contains(token) && !stdout.contains(token), "a token shown: {err:?}");
            }
            assert!(!sb.exists("ran"), "nothing runs without the store");
        }
    }
}

/// A client-go-style elector and leaderrun share one lock: the elector does not lead while a
/// leaderrun child runs (it takes the Lease only once leaderrun released it), and leaderrun
/// does not start its child while the elector leads (it takes the Lease only after the
/// elector died and its Lease stood unchanged for a whole lease). Every leader takes the
/// same flock: OVERLAP would show two at once.
#[test]
fn a_python_elector_and_leaderrun_never_lead_together() {
    let (server, sb) = started();
    let child = r#"exec 9>>"$D/flock"; flock -n 9 || echo "OVERLAP leaderrun" >> "$D/events"
        echo "start leaderrun $LEADERRUN_FENCING_TOKEN" >> "$D/events"; sleep 4
        echo "stop leaderrun $LEADERRUN_FENCING_TOKEN" >> "$D/events""#;
    let args = ["--lock", "shared", "--wait", "--ttl", "3s", "--renew-every", "1s", "--kill-after", "1s"];
    let first = sb.spawn("first", sb.at(URL, &[&args[..], &["--", "sh", "-c", child]].concat()));
    wait_for(|| sb.read("events").contains("start leaderrun"), SOON, "leaderrun's first child");

    // The elector's lease duration (what it waits for, by client-go's rule) is above
    // leaderrun's ttl, as it must be for peers to be safe with each other.
    let events = sb.file("events").display().to_string();
    let flock = sb.file("flock").display().to_string();
    let elector_args = ["--lock", "shared", "--identity", "python-elector", "--lease-duration", "5"];
    let mut elector = server.python_elector(&elector_args);
    elector.args(["--events", &events, "--flock", &flock, "--lead-for", "4", "--then", "crash"]);
    elector.stdin(Stdio::null());
    let elector = sb.spawn("elector", elector);
    wait_for(|| sb.read("events").contains("start elector"), Duration::from_secs(60), "the elector to lead");
    let second = sb.spawn("second", sb.at(URL, &[&args[..], &["--", "sh", "-c", child]].concat()));

    for (name, w) in [("first", first), ("second", second), ("elector", elector)] {
        let out = w.finish(Duration::from_secs(90));
        assert_eq!(out.status.code(), Some(0), "{name}: stderr {:?}", stderr_of(&out));
    }
    let lines = sb.lines("events");
    assert!(!lines.iter().any(|l| l.starts_with("OVERLAP")), "two leaders at once: {lines:#?}");
    let order: Vec<String> = lines.iter().map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    let expected =
        ["start leaderrun", "stop leaderrun", "start elector", "stop elector", "start leaderrun", "stop leaderrun"];
    assert_eq!(order, expected, "{lines:#?}");
    let holder = server.kubectl_ok(&["get", "lease", "shared", "-o", "jsonpath=[{.spec.holderIdentity}]"]);
    assert_eq!(holder, "[]", "leaderrun released it as client-go does");
}

/// A Lease the elector released as client-go's ReleaseOnCancel does (holderIdentity "") is
/// free for leaderrun at once, even with a long leaseDurationSeconds left on it: a one-shot
/// run with a short --timeout takes it and runs.
#[test]
fn a_lease_the_python_elector_released_is_free_at_once() {
    let (server, sb) = started();
    let (events, flock) = (sb.file("events").display().to_string(), sb.file("flock").display().to_string());
    let mut elector = server.python_elector(&["--lock", "handoff", "--identity", "python-elector"]);
    elector.args(["--events", &events, "--flock", &flock, "--lead-for", "0.5", "--then", "release"]);
    elector.args(["--released-duration", "3600"]);
    elector.stdin(Stdio::null());
    let out = sb.spawn("elector", elector).finish(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "elector: stderr {:?}", stderr_of(&out));
    assert!(sb.read("events").contains("released elector"), "{}", sb.read("events"));

    let run = ["--lock", "handoff", "--timeout", "5s", "-E", "3", "--", "sh", "-c", r#"touch "$D/ran""#];
    let out = sb.output(sb.at(URL, &run));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"), "the released Lease was taken at once");
}
