//! Waiting on a store that cannot watch (the object stores): the core reads the record
//! every `Records::poll_every` to 1.5 × that (so that many waiters spread out, and never
//! more than one request per `poll_every`), and compares versions. A failed read (an
//! outage) tells nothing: the next poll asks again. `Records::changed`'s default, which polls
//! the same way, is beside the trait (`records::until_moved`).

use std::time::Duration;

use super::records::{pause, Feed, Records, Version};

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
