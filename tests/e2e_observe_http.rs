//! End-to-end tests of `--http ADDR`: two `--wait` runs of the real binary on one lock, each
//! serving /healthz, /readyz and /metrics, read over plain HTTP/1.0 through a change of
//! leader; the exposition linted by `promtool check metrics` (Debian's `prometheus`
//! package: the tests fail without it); and the flag's usage errors, which write nothing.
//! Waits are on answers with generous bounds; nothing asserts that something was fast.

mod common;
mod servers;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use servers::free_port;

/// A child that records its pid and then runs until killed.
const HOLD: &str = r#"echo $$ > "$D/$NAME.tmp"; mv "$D/$NAME.tmp" "$D/$NAME.pid"; exec sleep 1000"#;

const LOCK: &str = "web-primary";

/// One answer of the server.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

/// `GET path` on 127.0.0.1:port over HTTP/1.0; `None` if nothing listens there.
fn get(port: u16, path: &str) -> Option<Reply> {
    get_accepting(port, path, "*/*")
}

/// `GET path` with `Accept: accept`.
fn get_accepting(port: u16, path: &str, accept: &str) -> Option<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(SOON)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap_or_else(|e| panic!("GET {path}: cannot read the answer: {e}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("GET {path}: no HTTP answer: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status in {head:?}"));
    Some(Reply { status, head: head.to_string(), body: body.to_string() })
}

/// A run with --http, seen from outside.
struct Served {
    wrapper: Wrapper,
    port: u16,
    name: &'static str,
}

impl Served {
    fn get(&self, path: &str) -> Reply {
        get(self.port, path).unwrap_or_else(|| {
            panic!("{}: nothing listens on {} (stderr {:?})", self.name, self.port, self.wrapper.stderr())
        })
    }

    /// Wait until `path` answers `status`; return that answer.
    fn wait_for(&self, path: &str, status: u16, within: Duration) -> Reply {
        let started = std::time::Instant::now();
        loop {
            let last = get(self.port, path);
            match last {
                Some(reply) if reply.status == status => return reply,
                _ if started.elapsed() > within => panic!(
                    "{} did not answer {status} on {path} within {within:?}; last: {last:?}; stderr {:?}",
                    self.name,
                    self.wrapper.stderr()
                ),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// /metrics in Prometheus' text format, linted by promtool; and as OpenMetrics, which
    /// Prometheus asks for, with the same families.
    fn metrics(&self) -> Exposition {
        let reply = self.get("/metrics");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(
            reply.head.to_lowercase().contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{reply:?}"
        );
        promtool_check(&reply.body);
        let open = get_accepting(self.port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
            .expect("the server is up");
        let content_type = "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8";
        assert!(open.head.to_lowercase().contains(content_type), "{open:?}");
        assert!(open.body.ends_with("# EOF\n"), "{open:?}");
        let families = |page: &str| page.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!(families(&open.body), families(&reply.body), "{open:?}");
        Exposition(reply.body)
    }
}

/// Start `leaderrun --wait --http 127.0.0.1:PORT --identity NAME ARGS -- HOLD` on `url`.
fn serve(sb: &Sandbox, url: &str, name: &'static str, args: &[&str]) -> Served {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let base = ["--lock", LOCK, "--wait", "--http", &addr, "--identity", name];
    let mut cmd = sb.at(url, &[&base[..], args, &["--", "sh", "-c", HOLD]].concat());
    cmd.env("NAME", name);
    Served { wrapper: sb.spawn(name, cmd), port, name }
}

/// A /metrics page.
struct Exposition(String);

impl Exposition {
    /// The value of the series `name{labels}` (labels in any order), if present.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.0.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, rest) = series.split_once('{').unwrap_or((series, "}"));
            let found: BTreeMap<String, String> = rest
                .trim_end_matches('}')
                .split("\",")
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| pair.split_once("=\""))
                .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
                .collect();
            (series_name == name && found == wanted).then(|| value.parse().expect("a number"))
        })
    }

    /// As `value`, for a series with the lock's label and `extra`; it must be there.
    fn of(&self, name: &str, extra: &[(&str, &str)]) -> f64 {
        let labels: Vec<(&str, &str)> = [("lock", LOCK)].into_iter().chain(extra.iter().copied()).collect();
        self.value(name, &labels).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{}", self.0))
    }
}

/// `promtool check metrics` must accept the page (and must be installed: this fails, not skips).
fn promtool_check(page: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) must be installed to lint /metrics");
    child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Both runs healthy; `leader` ready and counted as the leader, `standby` not, naming who holds.
fn assert_one_leader(leader: &Served, standby: &Served, token: f64) {
    leader.wait_for("/healthz", 200, WITHIN_A_LEASE);
    standby.wait_for("/healthz", 200, WITHIN_A_LEASE);
    assert_eq!(leader.wait_for("/readyz", 200, WITHIN_A_LEASE).body, "ok\n");
    let reply = standby.wait_for("/readyz", 503, SOON);
    assert_eq!(reply.body, format!("standby; held by {}\n", leader.name));

    let page = leader.metrics();
    assert_eq!(page.of("leaderrun_leader", &[]), 1.0);
    assert_eq!(page.of("leaderrun_fencing_token", &[]), token);
    assert_eq!(page.of("leaderrun_child_starts_total", &[]), 1.0);
    assert_eq!(page.of("leaderrun_acquire_attempts_total", &[("result", "won")]), 1.0);
    assert!(page.of("leaderrun_stop_signal_in_seconds", &[]) > 0.0, "{}", page.0);
    assert!(page.of("leaderrun_store_request_duration_seconds_count", &[("operation", "acquire")]) >= 1.0);
    let page = standby.metrics();
    assert_eq!(page.of("leaderrun_leader", &[]), 0.0);
    assert_eq!(page.of("leaderrun_fencing_token", &[]), 0.0);
    assert_eq!(page.of("leaderrun_stop_signal_in_seconds", &[]), 0.0);
    assert_eq!(page.of("leaderrun_acquire_attempts_total", &[("result", "won")]), 0.0);
    assert!(page.of("leaderrun_acquire_attempts_total", &[("result", "held")]) >= 1.0);
    assert_eq!(page.of("leaderrun_child_starts_total", &[]), 0.0);
}

/// After a change of leader, `new` leads with `token`, elected once.
fn assert_took_over(new: &Served, token: f64) {
    assert_eq!(new.wait_for("/readyz", 200, WITHIN_A_LEASE).body, "ok\n");
    assert_eq!(new.get("/healthz").status, 200);
    let page = new.metrics();
    assert_eq!(page.of("leaderrun_leader", &[]), 1.0);
    assert_eq!(page.of("leaderrun_fencing_token", &[]), token);
    assert_eq!(page.of("leaderrun_leadership_transitions_total", &[]), 1.0);
    assert_eq!(page.of("leaderrun_child_starts_total", &[]), 1.0);
    assert_eq!(page.of("leaderrun_acquire_attempts_total", &[("result", "won")]), 1.0);
}

/// On the embedded store: the leader's child is killed, so the leader ends and its port
/// closes; the standby, which was healthy all along although it waits in the kernel without
/// asking the store anything while idle (--http makes it ask every ttl/2), takes over.
#[test]
fn readiness_and_the_leader_gauge_move_with_the_lease() {
    let sb = Sandbox::new();
    let url = sb.store_url();
    let lease = ["--ttl", "2s", "--renew-every", "500ms"];
    let mut a = serve(&sb, &url, "host-a", &lease);
    let child_a = sb.wait_pid("host-a.pid");
    let mut b = serve(&sb, &url, "host-b", &lease);
    assert_one_leader(&a, &b, 1.0);
    assert_eq!(a.get("/nowhere").status, 404);

    // More than a ttl idle: the standby still asks, so it stays healthy.
    let held = b.metrics().of("leaderrun_acquire_attempts_total", &[("result", "held")]);
    wait_for(
        || b.metrics().of("leaderrun_acquire_attempts_total", &[("result", "held")]) >= held + 3.0,
        WITHIN_A_LEASE,
        "the idle standby to ask the store again, three times",
    );
    assert_eq!(b.get("/healthz").status, 200);
    assert_eq!(a.get("/healthz").status, 200);

    kill(Pid::from_raw(child_a), Signal::SIGKILL).unwrap();
    assert_eq!(a.wrapper.wait_code(SOON), 128 + 9);
    assert!(get(a.port, "/healthz").is_none(), "the old leader's port closed with it");
    sb.wait_pid("host-b.pid");
    assert_took_over(&b, 2.0);

    b.wrapper.signal(Signal::SIGTERM);
    assert_eq!(b.wrapper.wait_code(SOON), 128 + 15);
}

/// On PostgreSQL: while the server is down both runs turn unhealthy, saying for how long the
/// store has not answered; the leader's lease is lost; once the server is back the standby is
/// healthy again and takes over.
#[cfg(feature = "postgres")]
#[test]
fn health_follows_the_stores_answers() {
    let (pg, sb) = (servers::postgres::Postgres::start(), Sandbox::new());
    let url = pg.url();
    let lease = ["--ttl", "3s", "--renew-every", "1s"];
    let mut a = serve(&sb, &url, "host-a", &lease);
    sb.wait_pid("host-a.pid");
    let b = serve(&sb, &url, "host-b", &lease);
    assert_one_leader(&a, &b, 1.0);

    pg.stop();
    let reply = b.wait_for("/healthz", 503, WITHIN_A_LEASE);
    assert!(reply.body.starts_with("no answer from the store for "), "{reply:?}");
    assert_eq!(b.get("/readyz").status, 503);
    // The leader stops its child when its lease can no longer be trusted, and ends.
    assert_eq!(a.wrapper.wait_code(WITHIN_A_LEASE), 75, "stderr {}", a.wrapper.stderr());
    let page = b.metrics();
    assert!(page.of("leaderrun_acquire_attempts_total", &[("result", "failed")]) >= 1.0);

    pg.start_again();
    b.wait_for("/healthz", 200, WITHIN_A_LEASE);
    sb.wait_pid("host-b.pid");
    assert_took_over(&b, 2.0);
}

/// A bad --http is a usage error, found before the store is opened: nothing is written.
#[test]
fn a_bad_address_or_a_port_in_use_exits_2_and_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb.output(sb.cmd(&["--lock", LOCK, "--http", "nonsense", "--", "true"]));
    assert_eq!(out.status.code(), Some(2), "stderr {:?}", stderr_of(&out));
    assert!(stderr_of(&out).contains("--http"), "{:?}", stderr_of(&out));

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = sb.output(sb.cmd(&["--lock", LOCK, "--http", &addr, "--", "true"]));
    assert_eq!(out.status.code(), Some(2), "stderr {:?}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(&format!("--http {addr}: cannot listen: Address already in use")), "{err:?}");

    assert!(!sb.store_path().exists(), "the store was opened: {:?}", sb.processes());
}
