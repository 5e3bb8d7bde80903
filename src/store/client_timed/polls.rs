//! Waiting on a store that cannot watch (the object stores): the core reads the record
//! every `Records::poll_every` to 1.5 × that (so that many waiters spread out, and never
//! more than one request per `poll_every`), and compares versions. A failed read (an
//! outage) tells nothing: the next poll asks again.

use std::time::Duration;

use tokio::time::Instant;

use super::records::{Feed, Records, Version};

fn pause(every: Duration) -> Duration {
    every.mul_f64(rand::random_range(1.0..1.5))
}

/// A feed made of polls, for a waiting standby (`watchers.rs`): each read whose version
/// differs from the last is fed on, and a deletion ends the feed, as it ends a watch. It
/// stops when the feed is dropped.
pub fn feed(records: std::sync::Arc<dyn Records>, lock: String, mut last: Version, every: Duration) -> Feed {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(pause(every)) => {}
            }
            let Ok(read) = records.read(&lock).await else { continue };
            let Some(now) = read.found.as_ref().map(|f| f.version.clone()) else {
                let _ = tx.send(read).await;
                return;
            };
            if now != last {
                last = now;
                if tx.send(read).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// `Records::changed` by polling: return once a read shows a version other than `version`
/// (with none, other than the first read's, made at once), or after `max_wait`.
pub async fn until_moved<R: Records + ?Sized>(
    records: &R,
    every: Duration,
    lock: &str,
    version: Option<&Version>,
    max_wait: Duration,
) {
    let deadline = Instant::now() + max_wait;
    let mut seen: Option<Option<Version>> = version.map(|v| Some(v.clone()));
    loop {
        if seen.is_some() {
            tokio::time::sleep_until(deadline.min(Instant::now() + pause(every))).await;
        }
        if Instant::now() >= deadline {
            return;
        }
        let Ok(read) = records.read(lock).await else {
            // An outage: wait a poll before asking again, even before the first answer.
            tokio::time::sleep_until(deadline.min(Instant::now() + pause(every))).await;
            continue;
        };
        let now = read.found.map(|f| f.version);
        match &seen {
            Some(before) if *before != now => return,
            Some(_) => {}
            None => seen = Some(now),
        }
    }
}
