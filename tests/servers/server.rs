//! What every single test server offers, whatever its engine: a fresh start, how a client
//! reaches it (directly or through a proxy in front of it), the secret a client signs in
//! with, and the faults done to it (a clean stop, a crash, a freeze, an outage). The shared
//! end-to-end suite (tests/e2e/) and the fault run (bench/backend.rs) use nothing else.
//! The 3-node clusters have their own `Cluster` trait: their faults are a node's.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub trait TestServer: Send + Sync {
    /// Start a new server on free ports of 127.0.0.1; panics with the reason if it cannot.
    fn start() -> Self
    where
        Self: Sized;

    /// The port clients connect to.
    fn port(&self) -> u16;

    /// The store URL of a client that connects to `port` of 127.0.0.1 (the server's own, or a
    /// proxy's in front of it), credentials included where the URL carries them.
    fn url_via(&self, port: u16) -> String;

    /// The environment a leaderrun process needs besides that URL to reach the server through
    /// `port` and sign in (an emulator's address, a kubeconfig, AWS keys); none by default.
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        let _ = port;
        Vec::new()
    }

    /// The store URL of a client of this server.
    fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// The environment of a client of this server.
    fn env(&self) -> Vec<(String, String)> {
        self.env_via(self.port())
    }

    /// The secret a client signs in with (a password, a token, a key), which nothing leaderrun
    /// prints may show; `None` when the server lets anyone in.
    fn secret(&self) -> Option<String> {
        None
    }

    /// A client that signs in with a wrong secret; `None` when the server lets anyone in.
    fn wrong_secret(&self) -> Option<WrongSecret> {
        None
    }

    /// The server's processes while it runs (a server's worker processes too), to freeze them.
    fn pids(&self) -> Vec<u32>;

    /// Stop the server cleanly and wait until it is gone; its data is kept, its port refuses.
    fn stop(&self);

    /// Start the stopped server again, on the same port with the same data, and wait until
    /// it answers.
    fn start_again(&self);

    /// SIGKILL the server, as a crash would, and reap it: then as after `stop`, ready for
    /// `start_again`, with whatever a crash keeps of its data.
    fn kill(&self) {
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        // Reaps the killed process (stopping one that is gone does nothing more).
        self.stop();
    }

    /// Stop the server and start it again.
    fn restart(&self) {
        self.stop();
        self.start_again();
    }

    /// The shortest lease the shared tests ask for (`Fixture::short_timing`): 3 s, or the
    /// shortest the store keeps where that is longer (Azure: 15 s).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// A lease long enough to ride out `outage`, the server's own restart included: a JVM
    /// that starts again on a busy machine can take ten seconds before it answers.
    fn outage_ttl(&self) -> Duration {
        Duration::from_secs(15)
    }

    /// Down for `lasting` (stopped cleanly), then back, answering again.
    fn outage(&self, lasting: Duration) {
        self.stop();
        std::thread::sleep(lasting);
        self.start_again();
    }

    /// SIGSTOP every process of the server: its connections stay open, requests to it hang.
    fn freeze(&self) {
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        }
    }

    /// SIGCONT every process of a frozen server.
    fn thaw(&self) {
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
    }
}

/// A server that can also be started with TLS, asking clients for a certificate of a
/// throw-away CA.
pub trait TlsServer: TestServer {
    /// Start a server that also listens for mutual TLS (`tls_url`).
    fn start_tls() -> Self
    where
        Self: Sized;

    /// The store URL of its TLS port, with the CA, the client's certificate and its key.
    fn tls_url(&self) -> String;
}

/// How a client that signs in with a wrong secret reaches a server.
pub struct WrongSecret {
    /// The store URL (the wrong secret in it, if the URL carries the secret).
    pub url: String,
    /// The environment besides it.
    pub env: Vec<(String, String)>,
    /// The wrong secret, which no output may show either.
    pub secret: String,
    /// What the server's refusal says, in leaderrun's message.
    pub refusal: &'static str,
}

impl WrongSecret {
    /// The server's own URL and environment with `right` replaced by a wrong secret.
    pub fn replacing(server: &dyn TestServer, right: &str, refusal: &'static str) -> Self {
        let secret = "Wrong-Secret-42".to_string();
        let url = server.url().replace(right, &secret);
        let env = server.env().into_iter().map(|(name, value)| (name, value.replace(right, &secret))).collect();
        Self { url, env, secret, refusal }
    }
}

/// `pid` and its children (a server's worker processes), from /proc.
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The parent is the second field after the command name, which ends at the last ')'.
        let parent = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(pid) {
            pids.push(child);
        }
    }
    pids
}
