//! A throw-away S3 server: moto (`moto_server`, PyPI `moto[server]`) on 127.0.0.1 on a free
//! port, with one bucket, stopped when dropped.
//!
//! moto keeps everything in memory, so a restart would lose every object. It can record
//! the requests it serves and replay them (`MOTO_ENABLE_RECORDING`, the recorder API under
//! `/moto-api/recorder/`): `start_again` starts a fresh server and replays the recording
//! into it, which rebuilds every object with the same body, so the same ETag (the body's
//! MD5). That is how the restart tests still run. Clients reach moto through a small TCP
//! gate on the public port, closed while the server is down and opened only once the
//! replay is done: a client must never see the empty server in between (it would take its
//! lease for deleted). Replay is in file order, which
//! is the order requests arrived: writes that raced on one key could replay in another order,
//! which no restart test does.
//!
//! By default moto takes any credentials. `start_with_iam` turns its IAM checks on: only a
//! user it created, signing with the right secret, may touch the bucket (and no restart).
//!
//! The binary: `$MOTO_SERVER`, else `moto_server` on PATH, else the one in
//! ~/.cache/leaderrun-test-tools/venv.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, WrongSecret};

pub const BUCKET: &str = "leaderrun-test";
pub const REGION: &str = "us-east-1";
/// What a client signs with on a server without IAM checks (moto takes anything).
const ANY_KEY: (&str, &str) = ("AKIAMOTOTESTKEY", "moto-test-secret");

pub struct Moto {
    dir: tempfile::TempDir,
    /// The public port (the gate's).
    port: AtomicU16,
    /// moto's own port, behind the gate.
    inner_port: AtomicU16,
    gate: Gate,
    server: ServerProcess,
    /// The access key id and secret clients sign with.
    key: (String, String),
    iam: bool,
}

const VENV: &str = ".cache/leaderrun-test-tools/venv/bin";

/// The venv's program `name`, if the venv has it.
fn in_venv(name: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(VENV).join(name)).filter(|p| p.is_file())
}

/// The moto_server binary, or a panic saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("moto_server"))
        .find(|p| p.is_file());
    on_path.or_else(|| in_venv("moto_server")).unwrap_or_else(|| {
        panic!(
            "moto_server not found: install it: python3 -m venv ~/.cache/leaderrun-test-tools/venv && \
             ~/.cache/leaderrun-test-tools/venv/bin/pip install 'moto[server]'"
        )
    })
}

impl Moto {
    /// Start a server that takes any credentials, with the bucket; panics if it cannot.
    pub fn start() -> Self {
        let moto = Self::start_process(false, (ANY_KEY.0.into(), ANY_KEY.1.into()));
        let (status, body) = moto.request("PUT", &format!("/{BUCKET}"), "").expect("create the bucket");
        assert_eq!(status, 200, "create the bucket: {body}");
        moto
    }

    /// Start a server that checks signatures against its IAM users: one user may use the
    /// bucket, with the key `key()` returns.
    pub fn start_with_iam() -> Self {
        // The set-up's four requests (user, policy, key, bucket) go before IAM checks begin.
        let mut moto = Self::start_process(true, (String::new(), String::new()));
        let script = r#"
import boto3, json, sys
kw = dict(endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="leaderrun")
iam.put_user_policy(UserName="leaderrun", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "dynamodb:*"], "Resource": "*"}]}))
key = iam.create_access_key(UserName="leaderrun")["AccessKey"]
boto3.client("s3", **kw).create_bucket(Bucket=sys.argv[2])
print(key["AccessKeyId"], key["SecretAccessKey"])
"#;
        let python = in_venv("python3").unwrap_or_else(|| PathBuf::from("python3"));
        let out = Command::new(python)
            .args(["-c", script, &moto.endpoint(), BUCKET])
            .output()
            .expect("run the venv's python (boto3 comes with moto)");
        assert!(out.status.success(), "IAM set-up failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let (id, secret) = text.trim().split_once(' ').expect("key id and secret");
        moto.key = (id.to_string(), secret.to_string());
        moto
    }

    fn start_process(iam: bool, key: (String, String)) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-moto-").tempdir().expect("create a temp dir");
        let (port, inner_port) = (AtomicU16::new(0), AtomicU16::new(0));
        let moto = Self { dir, port, inner_port, gate: Gate::default(), server: ServerProcess::default(), key, iam };
        let pick_ports = || {
            moto.port.store(super::free_port(), Ordering::SeqCst);
            moto.inner_port.store(super::free_port(), Ordering::SeqCst);
        };
        start_on_free_ports("moto_server", pick_ports, || {
            moto.try_start()?;
            moto.gate.open(moto.port(), moto.inner_port.load(Ordering::SeqCst)).map_err(|e| {
                moto.server.stop();
                format!("cannot listen on the public port: {e}")
            })
        });
        moto
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// `s3://leaderrun-test` (credentials and endpoint come from `env`).
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// The access key id and secret that sign requests.
    pub fn key(&self) -> (&str, &str) {
        (&self.key.0, &self.key.1)
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// moto's process, while it runs (to freeze it).
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Stop the server (its objects live on only in the recording); its port refuses
    /// connections, and open ones are cut.
    pub fn stop(&self) {
        self.close_gate();
        self.stop_process()
    }

    /// Start the stopped server again on the same port, and replay the recording into it (S3;
    /// DynamoDB restores its tables itself: `MotoDynamo`).
    pub fn start_again(&self) {
        self.start_again_with(|moto| {
            moto.drop_reads_from_the_recording();
            // Sent to moto's own port, the replay goes there too.
            let (status, body) =
                moto.request("POST", "/moto-api/recorder/replay-recording", "").expect("replay the recording");
            assert_eq!(status, 200, "replay: {body}");
        })
    }

    /// Start the stopped server again on the same port, let `restore` put its data back
    /// through moto's own port (`inner_port`), then open the gate.
    pub fn start_again_with(&self, restore: impl FnOnce(&Moto)) {
        assert!(!self.iam, "a server with IAM checks cannot be restarted (the restore would make new keys)");
        if let Err(why) = self.try_start() {
            panic!("moto_server does not start again: {why}");
        }
        restore(self);
        let inner = self.inner_port();
        self.gate.open(self.port(), inner).unwrap_or_else(|e| panic!("cannot listen on the public port again: {e}"));
    }

    /// Close the public port and cut the connections through it: no client reaches moto until
    /// `start_again`. moto itself still serves on `inner_port`.
    pub fn close_gate(&self) {
        self.gate.close();
    }

    /// Stop moto's process (after `close_gate`; SIGTERM, or reap one already SIGKILLed).
    pub fn stop_process(&self) {
        self.server.stop()
    }

    /// moto's own port, behind the gate.
    pub fn inner_port(&self) -> u16 {
        self.inner_port.load(Ordering::SeqCst)
    }

    /// Keep only the requests that may change an object: reads change nothing, and a long
    /// run (a fault run's waiters poll with HEAD every second) would otherwise make each
    /// replay longer than the last. A write that failed its precondition stays: replayed in
    /// the same order, it fails again.
    fn drop_reads_from_the_recording(&self) {
        let path = self.dir.path().join("recording");
        let Ok(text) = std::fs::read_to_string(&path) else { return };
        let read = |line: &str| line.contains("\"method\": \"GET\"") || line.contains("\"method\": \"HEAD\"");
        let kept: String = text.lines().filter(|line| !read(line)).map(|line| format!("{line}\n")).collect();
        std::fs::write(&path, kept).expect("rewrite the recording");
    }

    /// One unsigned HTTP/1.0 request to moto's own port; the status and body.
    fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let port = self.inner_port.load(Ordering::SeqCst);
        let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
        let head =
            format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\r\n", body.len());
        stream.write_all(head.as_bytes()).ok()?;
        stream.write_all(body.as_bytes()).ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        let (head, body) = reply.split_once("\r\n\r\n")?;
        Some((head.split_whitespace().nth(1)?.parse().ok()?, body.to_string()))
    }

    fn try_start(&self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let mut cmd = Command::new(binary());
        cmd.args(["-H", "127.0.0.1", "-p", &self.inner_port.load(Ordering::SeqCst).to_string()])
            .env("MOTO_ENABLE_RECORDING", "1")
            .env("MOTO_RECORDER_FILEPATH", self.dir.path().join("recording"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        if self.iam {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "4");
        }
        let child = cmd.spawn().map_err(|e| format!("cannot run moto_server: {e}"))?;
        self.server.set(child);
        // Any answer from the recorder's own API (which counts as no action for IAM's checks,
        // and is not recorded) says the server serves.
        let log = self.dir.path().join("log");
        let ready = self.server.wait_ready("moto_server", &log, Duration::from_millis(50), || {
            self.request("GET", "/moto-api/recorder/download-recording", "").is_some()
        });
        if ready.is_err() {
            self.stop();
        }
        ready
    }
}

/// A TCP gate: while open, every connection to the public port is passed on to moto's port.
#[derive(Default)]
struct Gate {
    /// Set to close: the accepting thread sees it and drops the listener (one per opening).
    closing: Mutex<Arc<AtomicBool>>,
    accepting: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Both ends of every connection passed on and not yet ended, by number, to cut them when
    /// closing. An ended one is forgotten: a long run passes on tens of thousands, and two
    /// descriptors kept for each ran the server's process out of them.
    streams: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>,
}

/// Numbers the connections a gate passes on.
static CONNECTIONS: AtomicU64 = AtomicU64::new(0);

impl Gate {
    fn open(&self, public: u16, inner: u16) -> std::io::Result<()> {
        let listener = TcpListener::bind(("127.0.0.1", public))?;
        listener.set_nonblocking(true)?;
        let closing = Arc::new(AtomicBool::new(false));
        let (stop, streams) = (closing.clone(), self.streams.clone());
        let accepting = std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", inner)) else { continue };
                let _ = client.set_nonblocking(false);
                let Ok(ends) = client.try_clone().and_then(|c| Ok([c, server.try_clone()?])) else { continue };
                let id = CONNECTIONS.fetch_add(1, Ordering::SeqCst);
                streams.lock().unwrap().insert(id, ends);
                let open = Arc::new(AtomicUsize::new(2));
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    let (streams, open) = (streams.clone(), open.clone());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                        // The second direction to end forgets the connection.
                        if open.fetch_sub(1, Ordering::SeqCst) == 1 {
                            streams.lock().unwrap().remove(&id);
                        }
                    });
                };
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    pipe(c, s);
                    pipe(server, client);
                }
            }
        });
        *self.closing.lock().unwrap() = closing;
        *self.accepting.lock().unwrap() = Some(accepting);
        Ok(())
    }

    fn close(&self) {
        self.closing.lock().unwrap().store(true, Ordering::SeqCst);
        if let Some(accepting) = self.accepting.lock().unwrap().take() {
            let _ = accepting.join();
        }
        for stream in self.streams.lock().unwrap().drain().flat_map(|(_, ends)| ends) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl TestServer for Moto {
    fn start() -> Self {
        Moto::start()
    }

    fn port(&self) -> u16 {
        Moto::port(self)
    }

    fn url_via(&self, _port: u16) -> String {
        format!("s3://{BUCKET}")
    }

    /// As the AWS CLI reads it: the endpoint, the keys and the region, no shared config or
    /// credentials file, no instance metadata.
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        let none = self.dir.path().join("no-such-file").display().to_string();
        [
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
            ("AWS_ACCESS_KEY_ID", self.key.0.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.key.1.clone()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_CONFIG_FILE", none.clone()),
            ("AWS_SHARED_CREDENTIALS_FILE", none),
            ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
        ]
        .map(|(name, value)| (name.to_string(), value))
        .into()
    }

    fn secret(&self) -> Option<String> {
        Some(self.key.1.clone())
    }

    /// Only with IAM checks (`start_with_iam`): otherwise moto takes any signature.
    fn wrong_secret(&self) -> Option<WrongSecret> {
        self.iam.then(|| WrongSecret::replacing(self, &self.key.1, "403"))
    }

    fn pids(&self) -> Vec<u32> {
        self.pid().into_iter().collect()
    }

    fn stop(&self) {
        Moto::stop(self)
    }

    fn start_again(&self) {
        Moto::start_again(self)
    }
}
