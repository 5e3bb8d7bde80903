//! A request that reaches etcd twice (a copy sent on another member, see `endpoints`), played
//! in the bad order on a real etcd that each test starts: the first copy lands, something may
//! happen, and the store sees only the second copy's answer (`client::Twice`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::client::Twice;
use super::wire::path;
use super::{EtcdStore, Target};
use crate::store::{Access, Acquire, Renew, Store};

/// A single-member etcd 3.4 (Debian's `etcd-server`) on free ports of 127.0.0.1, its data in a
/// temporary directory; killed when dropped.
struct Etcd {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

impl Etcd {
    fn start() -> Self {
        let mut why = String::new();
        // Ports are picked again if another process took one meanwhile.
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("leaderrun-etcd-unit-").tempdir().expect("a temp dir");
            let (port, peer) = (free_port(), free_port());
            let (client, peer) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{peer}"));
            let child = Command::new("etcd")
                .args(["--name", "t", "--data-dir", dir.path().join("data").to_str().unwrap()])
                .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                .arg(format!("--initial-cluster=t={peer}"))
                .arg("--unsafe-no-fsync")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run etcd (is etcd-server installed?)");
            let mut etcd = Self { child, port, _dir: dir };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if etcd.healthy() {
                    return etcd;
                }
                if let Ok(Some(status)) = etcd.child.try_wait() {
                    why = format!("etcd exited: {status}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            why = if why.is_empty() { "etcd is not healthy within 30 s".into() } else { why };
        }
        panic!("{why}");
    }

    /// `/health` answers that the member has a leader.
    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let mut answer = String::new();
        stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.contains(r#""health":"true""#)
    }

    async fn open(&self) -> Arc<EtcdStore> {
        let target = Target::parse(&format!("etcd://127.0.0.1:{}", self.port)).unwrap();
        Arc::new(EtcdStore::open(&target, Access::Create).await.expect("open the store"))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next request of `store` on `path` goes twice, `between` after the first copy landed.
fn twice(store: &EtcdStore, path: &'static str, between: impl std::future::Future<Output = ()> + Send + 'static) {
    *store.connection.twice.lock().unwrap() = Some(Twice { path, between: between.boxed() });
}

const TTL: Duration = Duration::from_secs(30);

/// A release with --min-hold whose re-put onto the keep's lease went twice: the first copy
/// moved the key, the second failed its compare. The keep stands: the key is still there,
/// kept, on a live lease, with the token it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_whose_re_put_went_twice_stands() {
    let etcd = tokio::task::spawn_blocking(Etcd::start).await.unwrap();
    let (store, other) = (etcd.open().await, etcd.open().await);
    let Acquire::Won(lease) = store.acquire("cron", "holder", TTL).await.unwrap() else { panic!("a free lock") };
    twice(&store, path::TXN, async {});
    store.release(&lease, Duration::from_secs(60)).await.unwrap();
    let record = other.status("cron").await.unwrap();
    assert!(record.is_held() && record.kept, "the keep is gone: {record:?}");
    assert_eq!(record.token, lease.token);
    assert!(record.expires_in.is_some_and(|left| left > Duration::from_secs(30)), "{record:?}");
    let Acquire::Held(_) = other.acquire("cron", "late", TTL).await.unwrap() else { panic!("a late host ran") };
}

/// An acquire whose transaction went twice, `leaderrun release` landing between the copies:
/// the second copy finds the run's own key, revoked. The run is not handed the lease as won:
/// it must learn that it was asked to stand down before its child starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_revoked_between_its_copies_is_not_won() {
    let etcd = tokio::task::spawn_blocking(Etcd::start).await.unwrap();
    let (store, operator) = (etcd.open().await, etcd.open().await);
    twice(&store, path::TXN, async move {
        let before = operator.revoke("worker").await.unwrap();
        assert!(before.is_some_and(|r| r.holder.as_deref() == Some("run")), "the first copy landed");
    });
    let lease = match store.acquire("worker", "run", TTL).await.unwrap() {
        Acquire::Won(lease) => panic!("won a lease revoked before the answer: {lease:?}"),
        Acquire::Confirm { lease, after } => {
            assert_eq!(after, Duration::ZERO);
            lease
        }
        other => panic!("not the run's own revoked lease: {other:?}"),
    };
    // The confirming renewal finds it revoked, and says so.
    match store.renew(&lease, TTL).await.unwrap() {
        Renew::Lost(Some(record)) => assert!(record.revoked && record.holder.as_deref() == Some("run"), "{record:?}"),
        other => panic!("the revoke went unnoticed: {other:?}"),
    }
    // The elector then gives it back: nothing runs under it, and the lock is free at once.
    store.release(&lease, Duration::ZERO).await.unwrap();
    assert!(!store.status("worker").await.unwrap().is_held());
}
