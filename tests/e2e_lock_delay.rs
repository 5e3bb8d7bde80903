//! `--lock-delay` end to end, on the embedded store and on every server store the tests can
//! start: a holder lost uncleanly (its leaderrun frozen by SIGSTOP, its child killed by the
//! watchdog at the stop time) keeps the lock closed for the delay after that stop time, while
//! a clean exit opens it at once. Time is CLOCK_BOOTTIME (/proc/uptime), the clock every
//! deadline is on. The assertions are orderings (the standby started no sooner than...),
//! never bounds on speed: every wait is generous.

mod common;
mod servers;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const LONG: Duration = Duration::from_secs(60);

/// How long the standby of a client-timed store may take: a whole observation of the lease
/// it last saw (ttl + delay, stretched for drift) after it first saw it, and its polls.
const TAKEOVER: Duration = Duration::from_secs(120);

/// The holder's child: ignores the stop signal (so it lives until the watchdog's SIGKILL at
/// the deadline) and notes, every 50 ms, the boot clock and the stop time its parent last
/// published (`STOP_AT_NANOSECONDS TOKEN` in LEADERRUN_LEASE_FILE).
const HOLDER: &str = r#"
    trap '' TERM
    echo $$ > "$D/holder.tmp"; mv "$D/holder.tmp" "$D/holder.pid"
    while true; do
        t=$(cut -d' ' -f1 /proc/uptime)
        published=$(cut -d' ' -f1 "$LEADERRUN_LEASE_FILE" 2>/dev/null)
        echo "$t ${published:-none}" >> "$D/holder.log"
        sleep 0.05
    done
"#;

/// The standby's child: notes the boot clock first thing.
const STANDBY: &str =
    r#"t=$(cut -d' ' -f1 /proc/uptime); echo "$t" > "$D/standby.tmp"; mv "$D/standby.tmp" "$D/standby.start""#;

/// The delay of the frozen-holder scenario, and the flags both runs share.
const DELAY_SECS: f64 = 3.0;
const TIMING: [&str; 4] = ["--ttl", "3s", "--lock-delay", "3s"];

/// What the holder's child left: the last boot-clock reading it took while alive, and the
/// last stop time its parent published (seconds on CLOCK_BOOTTIME).
fn holder_log(sb: &Sandbox) -> (f64, f64) {
    let lines = sb.lines("holder.log");
    let mut last_alive = None;
    let mut stop_at = None;
    for line in &lines {
        let mut words = line.split(' ');
        let Some(Ok(t)) = words.next().map(str::parse::<f64>) else { continue };
        last_alive = Some(t);
        if let Some(Ok(ns)) = words.next().map(str::parse::<u64>) {
            if ns > 0 {
                stop_at = Some(ns as f64 / 1e9);
            }
        }
    }
    (last_alive.expect("the holder's child ran"), stop_at.unwrap_or_else(|| panic!("no stop time in {lines:?}")))
}

/// A holder whose leaderrun freezes: the watchdog kills its child at the stop time, the
/// store keeps the lease for ttl + delay from the last renewal, and a waiting standby's child
/// starts no sooner than the delay after the holder's stop time (and after its child was last
/// seen alive). Without the delay it would start about a second after the stop time.
fn a_frozen_holder_keeps_the_lock_closed_for_the_delay(sb: &Sandbox, url: &str) {
    let run = |wait: bool, script: &str| {
        let mode: &[&str] = if wait { &["--lock", "frozen", "--wait"] } else { &["--lock", "frozen"] };
        sb.at(url, &[mode, &TIMING[..], &["--", "sh", "-c", script]].concat())
    };
    let mut holder = sb.spawn("holder", run(true, HOLDER));
    let child = sb.wait_pid("holder.pid");
    wait_for(|| sb.lines("holder.log").iter().any(|l| !l.ends_with(" none")), LONG, "the holder's stop time");
    let mut standby = sb.spawn("standby", run(true, STANDBY));
    // Give the standby time to find the lock held and wait, then freeze the holder.
    std::thread::sleep(Duration::from_secs(1));
    assert!(!sb.exists("standby.start"), "the standby ran beside the holder");
    holder.signal(Signal::SIGSTOP);
    wait_for(|| !pid_alive(child), LONG, "the watchdog to kill the frozen holder's child");
    wait_for(|| sb.exists("standby.start"), TAKEOVER, "the standby's child");
    let started: f64 = sb.read("standby.start").trim().parse().expect("a boot-clock reading");
    let (last_alive, stop_at) = holder_log(sb);
    assert!(
        started >= stop_at + DELAY_SECS,
        "the standby started at {started}, within {DELAY_SECS}s of the holder's stop time {stop_at}"
    );
    assert!(
        started >= last_alive + DELAY_SECS,
        "the standby started at {started}, within {DELAY_SECS}s of the holder's child's last sign of life {last_alive}"
    );
    assert_eq!(standby.wait_code(LONG), 0, "stderr {:?}", standby.stderr());
    holder.signal(Signal::SIGCONT);
    assert_eq!(holder.wait_code(LONG), 75, "the thawed holder lost its lease: stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(LONG);
}

/// A holder whose child exits releases at once: a standby gets in although the delay is far
/// longer than this test waits (no time is asserted, only that it got in).
fn a_clean_exit_opens_the_lock_at_once(sb: &Sandbox, url: &str, delay: &str) {
    let run =
        |script: &str| sb.at(url, &["--lock", "clean", "--wait", "--lock-delay", delay, "--", "sh", "-c", script]);
    let holder = sb.spawn("clean-holder", run(r#"touch "$D/up"; while [ ! -e "$D/go" ]; do sleep 0.05; done"#));
    wait_for(|| sb.exists("up"), LONG, "the holder's child");
    // The store keeps the lease for the default ttl (15 s) + the delay.
    let (code, status) = status_json(sb, url, "clean");
    let left = status["expires_in_seconds"].as_f64().unwrap_or_else(|| panic!("held, with an expiry: {status}"));
    assert!(code == 0 && left > 60.0, "the store keeps ttl + delay: {status}");
    let standby = sb.spawn("clean-standby", run(r#"touch "$D/standby-ran""#));
    std::thread::sleep(Duration::from_secs(1));
    assert!(!sb.exists("standby-ran"), "the standby ran beside the holder");
    std::fs::write(sb.file("go"), "").unwrap();
    let out = holder.finish(LONG);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let out = standby.finish(LONG);
    assert_eq!(out.status.code(), Some(0), "the standby got in: stderr {:?}", stderr_of(&out));
    assert!(sb.exists("standby-ran"));
}

/// Both scenarios on one store.
fn on_store(sb: &Sandbox, url: &str, long_delay: &str) {
    a_frozen_holder_keeps_the_lock_closed_for_the_delay(sb, url);
    a_clean_exit_opens_the_lock_at_once(sb, url, long_delay);
}

#[test]
fn sqlite() {
    let sb = Sandbox::new();
    on_store(&sb, &sb.store_url(), "10m");
    // A one-shot run's --min-hold keep opens the lock when it ends, not a delay later.
    let once = |name: &str| {
        let script = format!(r#"touch "$D/{name}""#);
        sb.output(sb.cmd(&["--lock", "kept", "--min-hold", "2s", "--lock-delay", "10m", "--", "sh", "-c", &script]))
    };
    assert_eq!(once("first").status.code(), Some(0));
    assert_eq!(sb.status("kept"), 0, "kept for --min-hold");
    wait_for(|| sb.status("kept") == 1, LONG, "the keep to end");
    assert_eq!(once("second").status.code(), Some(0));
    assert!(sb.exists("first") && sb.exists("second"), "both ran");
}

#[test]
fn a_bad_lock_delay_is_bad_usage_before_the_store_is_touched() {
    let sb = Sandbox::new();
    for (delay, needle) in [("ten", "--lock-delay"), ("10", "no unit"), ("24h", "--lock-delay 1day with --ttl 15s")] {
        let out = sb.output(sb.cmd(&["--lock", "bad", "--lock-delay", delay, "--", "sh", "-c", r#"touch "$D/ran""#]));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "--lock-delay {delay}: {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains(needle), "{needle:?} in {err:?}");
    }
    assert!(!sb.exists("ran") && !sb.store_path().exists(), "nothing ran, nothing was written");
}

#[cfg(feature = "postgres")]
#[test]
fn postgres() {
    let (pg, sb) = (servers::postgres::Postgres::start(), Sandbox::new());
    on_store(&sb, &pg.url(), "10m");
}

#[cfg(feature = "mysql")]
#[test]
fn mariadb() {
    let (db, sb) = (servers::mariadb::Mariadb::start(), Sandbox::new());
    on_store(&sb, &db.url(), "10m");
}

#[cfg(feature = "redis")]
#[test]
fn redis() {
    let (redis, sb) = (servers::redis::Redis::start(), Sandbox::new());
    on_store(&sb, &redis.url(), "10m");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd() {
    let (etcd, sb) = (servers::etcd::Etcd::start(), Sandbox::new());
    on_store(&sb, &etcd.url(), "10m");
}

#[cfg(feature = "nats")]
#[test]
fn nats() {
    let (nats, sb) = (servers::nats::Nats::start(), Sandbox::new());
    on_store(&sb, &nats.url(), "10m");
}

/// The test server grants sessions of up to 120 s: a lease (ttl + delay) of at most 95.6 s.
#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper() {
    let (zk, sb) = (servers::zookeeper::ZooKeeper::start(), Sandbox::new());
    on_store(&sb, &zk.url(), "75s");
}

#[cfg(feature = "s3")]
#[test]
fn s3() {
    let (moto, sb) = (servers::moto::Moto::start(), Sandbox::new());
    let dir = sb.file("home/.aws");
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!("[default]\nregion = {}\nendpoint_url = {}\n", servers::moto::REGION, moto.endpoint());
    std::fs::write(dir.join("config"), config).unwrap();
    let (key, secret) = moto.key();
    let credentials = format!("[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n");
    std::fs::write(dir.join("credentials"), credentials).unwrap();
    on_store(&sb, &moto.url(), "10m");
}

#[cfg(feature = "gcs")]
#[test]
fn gcs() {
    let gcs = servers::fake_gcs::FakeGcs::start();
    let sb = Sandbox::new().with_env("STORAGE_EMULATOR_HOST", &gcs.endpoint());
    on_store(&sb, &gcs.url(), "10m");
}

#[cfg(feature = "datastore")]
#[test]
fn datastore() {
    let ds = servers::datastore_emulator::DatastoreEmulator::start();
    let sb = Sandbox::new().with_env("DATASTORE_EMULATOR_HOST", &ds.host());
    on_store(&sb, &ds.url(), "10m");
}

#[cfg(feature = "kubernetes")]
#[test]
fn kubernetes() {
    let server = servers::kubernetes::KubeApiServer::start();
    // Nor the test runner's $KUBECONFIG: it would point leaderrun at their cluster.
    std::env::remove_var("KUBECONFIG");
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("home/.kube")).unwrap();
    std::fs::copy(server.kubeconfig(), sb.file("home/.kube/config")).unwrap();
    on_store(&sb, "k8s://", "10m");
}

/// ZooKeeper sizes a lease's session from what the store is asked to keep, ttl + delay: a run
/// learns whether the servers grant that session (not the default ttl's), lowers the default
/// ttl to fit when they do not, and refuses in one line what cannot fit.
#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_fits_the_lease_with_its_delay_to_the_servers_sessions() {
    use servers::zookeeper::ZooKeeper;
    let touch = ["--", "sh", "-c", r#"touch "$D/ran""#];
    // Sessions of up to 120 s: a 15 s ttl with a 30 s delay fits as it is.
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    let out = sb.output(sb.at(&zk.url(), &[&["-v", "--lock", "fits", "--lock-delay", "30s"][..], &touch].concat()));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(sb.exists("ran") && !err.contains("using the longest that fits"), "the default ttl stands: {err:?}");

    // Sessions of up to 10 s (ZooKeeper's default of 20 ticks): a lease of at most 6.4 s (the
    // session is the lease + 25% + a tick, bounded at 2 s: ZooKeeper does not tell its tick).
    let (zk, sb) = (ZooKeeper::start_with_default_session_limits(), Sandbox::new());
    let out = sb.output(sb.at(&zk.url(), &[&["-v", "--lock", "lowered", "--lock-delay", "5s"][..], &touch].concat()));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(err.contains("using the longest that fits") && err.contains("ttl=1s 400ms"), "-v says so: {err:?}");
    assert!(sb.exists("ran"));
    for (flags, needle) in [
        (&["--lock-delay", "8s"][..], "--lock-delay 8s leaves no ttl"),
        (&["--ttl", "5s", "--lock-delay", "5s"][..], "--ttl 5s + --lock-delay 5s is a lease of 10s"),
    ] {
        let out = sb.output(sb.at(&zk.url(), &[&["--lock", "refused"][..], flags, &touch].concat()));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains(needle) && err.contains("6s 400ms"), "{needle:?} in {err:?}");
    }
}

/// A Choria bucket keeps an entry for its max age, and a holder's whole lease must fit one
/// campaign interval + 200 ms there: with a delay, the ttl is what is left of it.
#[cfg(feature = "nats")]
#[test]
fn a_choria_bucket_fits_the_lease_with_its_delay() {
    let (nats, sb) = (servers::nats::Nats::start(), Sandbox::new());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Max age 6 s: Choria campaigns every 4.5 s, so a lease of at most 4.7 s.
    let _kv = runtime.block_on(nats.choria_bucket_with_max_age(Duration::from_secs(6)));
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    let touch = ["--", "sh", "-c", r#"touch "$D/ran""#];
    let out = sb.output(sb.at(&url, &[&["-v", "--lock", "my_app", "--lock-delay", "2s"][..], &touch].concat()));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(err.contains("using the longest that fits") && err.contains("ttl=2s 700ms"), "-v says so: {err:?}");
    assert!(sb.exists("ran"));
    for (flags, needle) in [
        (&["--lock-delay", "5s"][..], "--lock-delay 5s leaves no ttl"),
        (&["--ttl", "4s", "--lock-delay", "2s"][..], "--ttl 4s + --lock-delay 2s is a lease of 6s"),
    ] {
        let out = sb.output(sb.at(&url, &[&["--lock", "refused"][..], flags, &touch].concat()));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains(needle) && err.contains("4s 700ms"), "{needle:?} in {err:?}");
    }
}
