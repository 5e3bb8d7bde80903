//! What `leaderrun watch` waits on: the kernel's word that the database was written.
//!
//! Every write to the file (a take, a renewal, a keep, a revoke, a release, of any lock in
//! it) is a commit to its write-ahead log, `FILE-wal`, and a checkpoint later copies pages
//! into `FILE`. A watcher asks inotify for writes to either, on the directory (the log may be
//! made anew, and the file may not exist yet), and reads nothing until one comes: an idle
//! watcher costs nothing. It never opens the wake-up sidecar, so it takes no place in the
//! waiters' queue and no turn. An expiry writes nothing (a lease lapses on CLOCK_BOOTTIME
//! alone): `watch` reads again when the lease it saw would lapse.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tokio::io::unix::AsyncFd;

/// An inotify watch on the database's directory, for writes to the database or its log.
pub struct Writes {
    fd: AsyncFd<OwnedFd>,
    /// The names that count: the database file's and its log's.
    names: [OsString; 2],
}

/// What a look at the events found.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// The database or its log was written (or events were lost): read again.
    Written,
    /// The watch is gone (the directory was removed or moved): make a new one.
    Gone,
}

impl Writes {
    /// Watch the directory of the database `db`.
    pub fn new(db: &Path) -> io::Result<Self> {
        let dir = match db.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = db.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let mut log = name.to_os_string();
        log.push("-wal");
        let dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: plain system calls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by inotify_init1 and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ONLYDIR;
        // SAFETY: `dir` is a NUL-terminated string that outlives the call.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir.as_ptr(), mask) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is open and owned by the AsyncFd for its whole life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        let fd = fd.map_err(|err| err.into_parts().1)?;
        Ok(Self { fd, names: [name.to_os_string(), log] })
    }

    /// Wait until the database or its log is written (or the watch is gone). Writes that came
    /// since the last call are waiting in the kernel: they end this one at once.
    pub async fn next(&self) -> Seen {
        let mut buffer = [0u8; 4096];
        loop {
            let Ok(mut ready) = self.fd.readable().await else { return Seen::Written };
            // SAFETY: reads into a buffer of the length given.
            let read = unsafe { libc::read(self.fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            if read < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock {
                    ready.clear_ready();
                    continue;
                }
                return Seen::Gone;
            }
            if let Some(seen) = self.judge(&buffer[..read as usize]) {
                return seen;
            }
        }
    }

    /// What a batch of events says, if it concerns the database.
    fn judge(&self, mut events: &[u8]) -> Option<Seen> {
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut written = false;
        while events.len() >= HEADER {
            // SAFETY: the kernel writes whole events; read_unaligned copies the header out.
            let event: libc::inotify_event = unsafe { std::ptr::read_unaligned(events.as_ptr().cast()) };
            let end = (HEADER + event.len as usize).min(events.len());
            let name = &events[HEADER..end];
            let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
            if event.mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                return Some(Seen::Gone);
            }
            written |=
                event.mask & libc::IN_Q_OVERFLOW != 0 || self.names.iter().any(|counts| counts.as_bytes() == name);
            events = &events[end..];
        }
        written.then_some(Seen::Written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_to_the_database_or_its_log_count_and_others_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        let writes = Writes::new(&db).unwrap();
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        std::fs::write(dir.path().join("locks.db-wake"), b"x").unwrap();
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(100), writes.next()).await;
        assert!(quiet.is_err(), "other files do not count");
        std::fs::write(dir.path().join("locks.db-wal"), b"x").unwrap();
        assert_eq!(writes.next().await, Seen::Written);
        std::fs::write(&db, b"x").unwrap();
        assert_eq!(writes.next().await, Seen::Written);
    }
}
