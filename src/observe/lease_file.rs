//! The lease as the child sees it: a small file, named in the child's environment
//! (`LEADERRUN_LEASE_FILE`), that holds the instant on CLOCK_BOOTTIME at which the child
//! gets its stop signal, and the lease's fencing token. `leaderrun check` in the child
//! compares that instant with the clock itself, so its answer needs neither the store nor a
//! running parent: a parent that is frozen (SIGSTOP, a paused VM) stops refreshing the file,
//! and the answer turns to "no" at the stop time the parent last published, which is never
//! later than the parent's own.
//!
//! The file is replaced whole (written beside it, then renamed), so a reader sees the old
//! line or the new one, never half of either. It is rewritten when the lease is won, at
//! every renewal, and with a stop time of 0 when the lease stops being trusted; it is
//! removed with its directory when leadership ends. A wrapper that dies leaves it behind
//! with a stop time in the past or soon to be; its watchdog removes it as it stops the child.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::{Event, Observer, Renewal};

/// The child's variable that names the file.
pub const VARIABLE: &str = "LEADERRUN_LEASE_FILE";

/// The file's one line: `STOP_AT_NANOSECONDS TOKEN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// When the child gets its stop signal, on CLOCK_BOOTTIME; zero once the lease is not trusted.
    pub stop_at: Duration,
    pub token: u64,
}

impl Published {
    pub fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let stop_at = words.next()?.parse::<u64>().ok()?;
        let token = words.next()?.parse::<u64>().ok()?;
        Some(Self { stop_at: Duration::from_nanos(stop_at), token })
    }

    /// Read the file; `None` when it is gone or unreadable (the lease is over).
    pub fn read(path: &Path) -> Option<Self> {
        Self::parse(&fs::read_to_string(path).ok()?)
    }

    /// Whether the lease holds at `now` (CLOCK_BOOTTIME), for `token` if one is asked about.
    pub fn holds_at(&self, now: Duration, token: Option<u64>) -> bool {
        now < self.stop_at && token.is_none_or(|t| t == self.token)
    }
}

/// Keeps the file for one run.
pub struct LeaseFile {
    dir: PathBuf,
    file: PathBuf,
    token: Mutex<u64>,
}

impl LeaseFile {
    /// Where the file will be: a new directory under $XDG_RUNTIME_DIR, else /dev/shm, else the
    /// temporary directory (memory on most hosts). It is made only when the lease is won, so
    /// a standby that is killed leaves nothing behind; `mkdir` fails on a name that exists, so
    /// nobody can have put anything there first (the file is then missing: `check` says no).
    pub fn planned() -> Self {
        let base = [std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from), Some("/dev/shm".into())]
            .into_iter()
            .flatten()
            .find(|b| b.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("leaderrun-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        Self { file: dir.join("lease"), dir, token: Mutex::new(0) }
    }

    /// The file's path, for the child's environment.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// The directory, for the watchdog to remove if the wrapper dies.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn publish(&self, stop_at: Duration) {
        if let Err(err) = self.write(stop_at) {
            // `check` then answers from what it finds: an older stop time, or no file ("no").
            tracing::warn!("cannot update the lease file {}: {err}", self.file.display());
        }
    }

    /// Say "no" from now on. The watchdog removes the directory when it stops the child
    /// itself, often a moment before this run's own timer fires: a file already gone says
    /// "no" as well, and is not worth a warning.
    fn say_no(&self) {
        match self.write(Duration::ZERO) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && !self.dir.exists() => {
                tracing::debug!("the lease file {} is gone already (the watchdog removed it)", self.file.display())
            }
            Err(err) => tracing::warn!("cannot update the lease file {}: {err}", self.file.display()),
            Ok(()) => {}
        }
    }

    fn write(&self, stop_at: Duration) -> std::io::Result<()> {
        let token = *self.token.lock().unwrap_or_else(|p| p.into_inner());
        let next = self.dir.join("lease.next");
        fs::File::create(&next)
            .and_then(|mut f| writeln!(f, "{} {token}", stop_at.as_nanos()))
            .and_then(|()| fs::rename(&next, &self.file))
    }

    fn remove(&self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Observer for LeaseFile {
    fn event(&self, event: &Event<'_>) {
        match *event {
            Event::Elected { lease, stop_at, .. } => {
                *self.token.lock().unwrap_or_else(|p| p.into_inner()) = lease.token;
                match fs::create_dir(&self.dir) {
                    Ok(()) => self.publish(stop_at),
                    Err(err) => tracing::warn!(
                        "cannot make {} for the lease file ({err}): leaderrun check in the child will say no",
                        self.dir.display()
                    ),
                }
            }
            Event::Renewal(Renewal::Renewed { stop_at }) => self.publish(stop_at),
            Event::SteppingDown | Event::ChildEnded { .. } => self.say_no(),
            Event::Released | Event::Stopping => self.remove(),
            _ => {}
        }
    }
}

impl Drop for LeaseFile {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::ChildEnd;
    use crate::store::Lease;

    /// Every warning logged while `f` runs.
    fn warnings_of(f: impl FnOnce()) -> String {
        let seen = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer = seen.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || Sink(writer.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        text
    }

    struct Sink(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_file_the_watchdog_removed_first_says_no_without_a_warning() {
        let file = LeaseFile::planned();
        let lease = Lease { lock: "l".into(), identity: "me".into(), token: 7 };
        file.event(&Event::Elected { lease: &lease, slot: 0, stop_at: Duration::from_secs(100) });
        // The watchdog stopped the child at its stop time and removed the directory.
        fs::remove_dir_all(file.dir()).unwrap();
        let said = warnings_of(|| {
            file.event(&Event::SteppingDown);
            file.event(&Event::ChildEnded { exit: crate::payload::ChildExit::Code(0), why: ChildEnd::LeaseExpired });
        });
        assert_eq!(said, "", "nothing to warn about");
        assert!(!file.dir().exists(), "not made again");
        // A renewal's stop time that cannot be written is still worth a warning.
        let said = warnings_of(|| file.event(&Event::Renewal(Renewal::Renewed { stop_at: Duration::from_secs(9) })));
        assert!(said.contains("cannot update the lease file"), "{said:?}");
    }

    #[test]
    fn the_file_says_yes_until_the_stop_time_and_no_after_a_step_down() {
        let file = LeaseFile::planned();
        assert!(!file.dir().exists(), "nothing made before the lease is won");
        let lease = Lease { lock: "l".into(), identity: "me".into(), token: 7 };
        file.event(&Event::Elected { lease: &lease, slot: 0, stop_at: Duration::from_secs(100) });
        let seen = Published::read(file.path()).unwrap();
        assert_eq!(seen, Published { stop_at: Duration::from_secs(100), token: 7 });
        assert!(seen.holds_at(Duration::from_secs(99), None));
        assert!(seen.holds_at(Duration::from_secs(99), Some(7)));
        assert!(!seen.holds_at(Duration::from_secs(99), Some(6)));
        assert!(!seen.holds_at(Duration::from_secs(100), None), "no at the stop time itself");
        file.event(&Event::Renewal(Renewal::Renewed { stop_at: Duration::from_secs(200) }));
        assert!(Published::read(file.path()).unwrap().holds_at(Duration::from_secs(150), Some(7)));
        file.event(&Event::SteppingDown);
        assert!(!Published::read(file.path()).unwrap().holds_at(Duration::from_secs(150), None));
        file.event(&Event::Released);
        assert!(Published::read(file.path()).is_none());
        assert!(!file.dir().exists());
    }
}
