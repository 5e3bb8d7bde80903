//! The in-memory record store, for running the client-timed core on tokio's paused
//! clock: one version sequence for every write (as an API server's resourceVersion),
//! a server clock of its own, watches, and a way to delete a record behind everyone's
//! back (`kubectl delete lease`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use super::records::{Created, Feed, Found, Read, Record, Records, Version, Written};
use super::server_clock;
use crate::store::{Result, StoreError};

/// The last version issued, and each lock's record with its version.
type Rows = (u64, BTreeMap<String, (Record, u64)>);

/// What the "server" keeps, shared with the tasks that serve its watches.
struct Server {
    rows: Mutex<Rows>,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    /// The server's clock counts in steps of this (an HTTP `Date`: a second); zero: exact.
    resolution: Duration,
    /// Bumped at every write.
    writes: watch::Sender<u64>,
    /// Bumped to end every open watch.
    epoch: watch::Sender<u64>,
    /// Floors from the server's clock, as an object store gives them (S3, DynamoDB, Cloud
    /// Storage: `server_clock.rs`), instead of from the version sequence.
    seconds: bool,
}

impl Server {
    fn snapshot(&self, lock: &str) -> Read {
        let rows = self.rows.lock().unwrap();
        let found =
            rows.1.get(lock).map(|(record, v)| Found { record: record.clone(), version: Version(v.to_string()) });
        let floor = if self.seconds { server_clock::floor(Some(self.now()), found.is_some()) } else { rows.0 };
        Read { found, server_time: Some(self.now()), floor }
    }

    /// The server's clock, cut down to its resolution.
    fn now(&self) -> SystemTime {
        let now = (self.clock)();
        let step = self.resolution.as_nanos();
        if step == 0 {
            return now;
        }
        let since = now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        std::time::UNIX_EPOCH + Duration::from_nanos(u64::try_from(since - since % step).unwrap_or(u64::MAX))
    }

    fn version(&self, lock: &str) -> Option<Version> {
        self.rows.lock().unwrap().1.get(lock).map(|(_, v)| Version(v.to_string()))
    }

    /// Store `record` (or delete it) as the next version.
    fn write(&self, lock: &str, record: Option<&Record>) -> Version {
        self.write_if(lock, record, |_| true).expect("unconditional")
    }

    /// `write` if `current` (the lock's version now, `None` if absent) passes `check`, in
    /// one step under the lock.
    fn write_if(
        &self,
        lock: &str,
        record: Option<&Record>,
        check: impl Fn(Option<Version>) -> bool,
    ) -> Option<Version> {
        let mut rows = self.rows.lock().unwrap();
        if !check(rows.1.get(lock).map(|(_, v)| Version(v.to_string()))) {
            return None;
        }
        rows.0 += 1;
        let version = rows.0;
        match record {
            Some(record) => rows.1.insert(lock.to_string(), (record.clone(), version)),
            None => rows.1.remove(lock),
        };
        drop(rows);
        self.writes.send_replace(version);
        Some(Version(version.to_string()))
    }
}

pub struct MemoryRecords {
    server: Arc<Server>,
    /// Every request, by kind, and when it was made, for tests that count them.
    requests: Mutex<Vec<(&'static str, tokio::time::Instant)>>,
    /// Act as a store that cannot watch and is polled this often (an object store).
    polled: Option<Duration>,
    /// Hold this client's next create until the sender fires (or is dropped).
    create_gate: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    /// Fail the first read after this client's next create (a lost answer).
    fail_read_after_create: Mutex<(bool, bool)>,
}

impl MemoryRecords {
    pub fn new(clock: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        Self::with_resolution(clock, Duration::ZERO)
    }

    /// Records whose server clock counts in steps of `resolution` (an HTTP `Date`'s second).
    pub fn with_resolution(clock: Arc<dyn Fn() -> SystemTime + Send + Sync>, resolution: Duration) -> Self {
        let (writes, epoch) = (watch::channel(0).0, watch::channel(0).0);
        let server = Server { rows: Mutex::default(), clock, resolution, writes, epoch, seconds: false };
        Self::of(Arc::new(server))
    }

    /// Records whose token floors come from the server's clock in whole seconds, as an object
    /// store's `Date` gives them (`server_clock.rs`): no number outlives a deleted record.
    pub fn with_server_seconds(clock: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        let (writes, epoch) = (watch::channel(0).0, watch::channel(0).0);
        let resolution = Duration::from_secs(1);
        let server = Server { rows: Mutex::default(), clock, resolution, writes, epoch, seconds: true };
        Self::of(Arc::new(server))
    }

    fn of(server: Arc<Server>) -> Self {
        Self {
            server,
            requests: Mutex::default(),
            polled: None,
            create_gate: Mutex::default(),
            fail_read_after_create: Mutex::default(),
        }
    }

    /// Another client of the same records, with a request count of its own.
    pub fn client(&self) -> Self {
        Self::of(self.server.clone())
    }

    /// Fail the first read after this client's next create, as a lost answer would.
    pub fn fail_read_after_next_create(&self) {
        *self.fail_read_after_create.lock().unwrap() = (true, false);
    }

    /// Hold this client's next create, after its read, until the returned sender fires.
    pub fn gate_next_create(&self) -> tokio::sync::oneshot::Sender<()> {
        let (open, gate) = tokio::sync::oneshot::channel();
        *self.create_gate.lock().unwrap() = Some(gate);
        open
    }

    /// Another client of the same records that cannot watch, polled every `every`.
    pub fn polled_client(&self, every: Duration) -> Self {
        Self { polled: Some(every), ..self.client() }
    }

    fn log(&self, kind: &'static str) {
        self.requests.lock().unwrap().push((kind, tokio::time::Instant::now()));
    }

    /// How many requests of `kind` ("read", "create", "replace", "list", "changed", "watch") were made.
    pub fn count(&self, kind: &str) -> usize {
        self.requests.lock().unwrap().iter().filter(|(k, _)| *k == kind).count()
    }

    /// When each request of `kind` was made, in order.
    pub fn times(&self, kind: &str) -> Vec<tokio::time::Instant> {
        self.requests.lock().unwrap().iter().filter(|(k, _)| *k == kind).map(|(_, at)| *at).collect()
    }

    /// Delete the record with no precondition, as `kubectl delete lease` does.
    pub fn delete(&self, lock: &str) {
        self.server.write(lock, None);
    }

    /// Write a record as another client would (client-go), with no precondition.
    pub fn put(&self, lock: &str, record: Record) {
        self.server.write(lock, Some(&record));
    }

    /// The record as stored.
    pub fn get(&self, lock: &str) -> Option<Record> {
        self.server.snapshot(lock).found.map(|f| f.record)
    }

    /// End every open watch, as a server does at its watch timeout.
    pub fn end_watches(&self) {
        self.server.epoch.send_modify(|n| *n += 1);
    }
}

#[async_trait]
impl Records for MemoryRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        self.log("read");
        {
            let mut fail = self.fail_read_after_create.lock().unwrap();
            if *fail == (true, true) {
                *fail = (false, false);
                return Err(StoreError::unavailable("the read's answer was lost"));
            }
        }
        Ok(self.server.snapshot(lock))
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        self.log("create");
        let gate = self.create_gate.lock().unwrap().take();
        if let Some(gate) = gate {
            let _ = gate.await; // held up between its read and its write, as on a slow network
        }
        let Some(version) = self.server.write_if(lock, Some(record), |now| now.is_none()) else {
            return Ok(Created::Moved);
        };
        {
            let mut fail = self.fail_read_after_create.lock().unwrap();
            fail.1 = fail.0;
        }
        if self.server.seconds {
            return Ok(Created::Done { version, floor: server_clock::create_floor(Some(self.server.now())) });
        }
        // Every token is at most the version of the write that carried it (it is one more than
        // a version read before that write), so every write before this one carried less.
        let floor = version.0.parse::<u64>().expect("a number") - 1;
        Ok(Created::Done { version, floor })
    }

    async fn replace(&self, lock: &str, record: &Record, version: &Version) -> Result<Written> {
        self.log("replace");
        let current = |now: Option<Version>| now.as_ref() == Some(version);
        Ok(self.server.write_if(lock, Some(record), current).map_or(Written::Moved, Written::Done))
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        self.log("list");
        let rows = self.server.rows.lock().unwrap();
        Ok(rows.1.iter().map(|(lock, (record, _))| (lock.clone(), record.clone())).collect())
    }

    async fn changed(&self, lock: &str, version: Option<&Version>, max_wait: Duration) {
        if let Some(every) = self.polled {
            return super::records::until_moved(self, every, lock, version, max_wait).await;
        }
        self.log("changed");
        let mut writes = self.server.writes.subscribe();
        // With no version seen, any write from now on counts.
        let wait = async {
            loop {
                if version.is_some() && self.server.version(lock).as_ref() != version {
                    return;
                }
                if writes.changed().await.is_err() || version.is_none() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(max_wait, wait).await;
    }

    fn poll_every(&self) -> Option<Duration> {
        self.polled
    }

    fn server_clock_resolution(&self) -> Duration {
        self.server.resolution
    }

    fn counts(&self, token: u64, read: &Read) -> bool {
        !self.server.seconds || server_clock::token_counts(token, read.server_time)
    }

    async fn watch(&self, lock: &str, version: &Version) -> Result<Option<Feed>> {
        if self.polled.is_some() {
            return Ok(None);
        }
        self.log("watch");
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let server = self.server.clone();
        let (mut writes, mut epoch) = (server.writes.subscribe(), server.epoch.subscribe());
        let (lock, mut last) = (lock.to_string(), Some(version.clone()));
        tokio::spawn(async move {
            loop {
                let read = server.snapshot(&lock);
                let now = read.found.as_ref().map(|f| f.version.clone());
                if now != last {
                    let deleted = now.is_none();
                    if tx.send(read).await.is_err() || deleted {
                        return;
                    }
                    last = now;
                }
                tokio::select! {
                    changed = writes.changed() => if changed.is_err() { return },
                    _ = epoch.changed() => return,
                }
            }
        });
        Ok(Some(rx))
    }
}
