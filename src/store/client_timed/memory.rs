//! The in-memory record store, for running the client-timed core on tokio's paused
//! clock: one version sequence for every write (as an API server's resourceVersion),
//! a server clock of its own, change notification, and a way to delete a record
//! behind everyone's back (`kubectl delete lease`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use super::records::{Found, Read, Record, Records, Version, Written};
use crate::store::Result;

/// The last version issued, and each lock's record with its version.
type Rows = (u64, BTreeMap<String, (Record, u64)>);

pub struct MemoryRecords {
    rows: Mutex<Rows>,
    /// The server's clock.
    server_clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    /// Bumped at every write, for `changed`.
    writes: watch::Sender<u64>,
    /// Every request, by kind, for tests that count them.
    pub requests: Mutex<Vec<&'static str>>,
}

impl MemoryRecords {
    pub fn new(server_clock: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        Self { rows: Mutex::default(), server_clock, writes: watch::channel(0).0, requests: Mutex::default() }
    }

    fn log(&self, kind: &'static str) {
        self.requests.lock().unwrap().push(kind);
    }

    /// Store `record` as the next version (the caller checked the precondition).
    fn write(&self, rows: &mut Rows, lock: &str, record: &Record) -> Version {
        rows.0 += 1;
        rows.1.insert(lock.to_string(), (record.clone(), rows.0));
        self.writes.send_replace(rows.0);
        Version(rows.0.to_string())
    }

    /// Delete the record with no precondition, as `kubectl delete lease` does.
    pub fn delete(&self, lock: &str) {
        let mut rows = self.rows.lock().unwrap();
        rows.0 += 1;
        rows.1.remove(lock);
        self.writes.send_replace(rows.0);
    }

    /// Write a record as another client would (client-go), with no precondition.
    pub fn put(&self, lock: &str, record: Record) {
        let mut rows = self.rows.lock().unwrap();
        self.write(&mut rows, lock, &record);
    }

    /// The record as stored.
    pub fn get(&self, lock: &str) -> Option<Record> {
        self.rows.lock().unwrap().1.get(lock).map(|(r, _)| r.clone())
    }
}

#[async_trait]
impl Records for MemoryRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        self.log("read");
        let rows = self.rows.lock().unwrap();
        let found =
            rows.1.get(lock).map(|(record, v)| Found { record: record.clone(), version: Version(v.to_string()) });
        Ok(Read { found, server_time: Some((self.server_clock)()), floor: rows.0 })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Written> {
        self.log("create");
        let mut rows = self.rows.lock().unwrap();
        if rows.1.contains_key(lock) {
            return Ok(Written::Moved);
        }
        Ok(Written::Done(self.write(&mut rows, lock, record)))
    }

    async fn replace(&self, lock: &str, record: &Record, version: &Version) -> Result<Written> {
        self.log("replace");
        let mut rows = self.rows.lock().unwrap();
        match rows.1.get(lock) {
            Some((_, v)) if v.to_string() == version.0 => Ok(Written::Done(self.write(&mut rows, lock, record))),
            _ => Ok(Written::Moved),
        }
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        self.log("list");
        Ok(self.rows.lock().unwrap().1.iter().map(|(lock, (record, _))| (lock.clone(), record.clone())).collect())
    }

    async fn changed(&self, lock: &str, version: Option<&Version>, max_wait: Duration) {
        self.log("watch");
        let mut writes = self.writes.subscribe();
        let current = || self.rows.lock().unwrap().1.get(lock).map(|(_, v)| v.to_string());
        let moved = |seen: Option<&Version>| current() != seen.map(|v| v.0.clone());
        // With no version seen, any write from now on counts.
        let wait = async {
            while version.is_none() || !moved(version) {
                if writes.changed().await.is_err() || version.is_none() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(max_wait, wait).await;
    }
}
