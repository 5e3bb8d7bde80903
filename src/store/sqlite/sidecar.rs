//! The wake-up file beside the database (`FILE-wake`) and the kernel calls on it.
//!
//! It holds no data. Each lock name owns one byte of it (at an offset hashed from the
//! name), and an open file description locks that byte (an OFD lock) while it holds the
//! lease or queues for it. OFD locks belong to one `open()` of the file, not to the
//! process, so several waiters in one process queue like separate processes, and the
//! kernel drops a lock when its holder dies. A write to the file (a "touch") is seen
//! through inotify. None of this decides anything: the database stays the only path
//! to a lease.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};

/// The sidecar's path for a database file.
pub fn path_for(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wake");
    PathBuf::from(name)
}

/// A new open file description of the sidecar (its own lock owner). With `create`, a
/// missing sidecar is created with the database's mode and owner, as SQLite does for its
/// -wal and -shm files, so every user who may write the database may queue.
pub fn open(sidecar: &Path, db: &Path, create: bool) -> io::Result<File> {
    // Never through a symlink (as SQLite opens its own files): a touch writes to the file, and
    // a link planted in a shared directory must not point that write elsewhere.
    let existing = || OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(sidecar);
    match existing() {
        Err(err) if err.kind() == io::ErrorKind::NotFound && create => {}
        other => return other,
    }
    let meta = std::fs::metadata(db)?;
    let mode = meta.mode() & 0o666;
    match OpenOptions::new().read(true).write(true).create_new(true).mode(mode).open(sidecar) {
        Ok(file) => {
            // The umask may have narrowed the mode; the database's owner may not be us (root).
            file.set_permissions(Permissions::from_mode(mode))?;
            if nix::unistd::geteuid().is_root() {
                std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))?;
            }
            Ok(file)
        }
        // Another process created it in the meantime.
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => existing(),
        Err(err) => Err(err),
    }
}

/// The byte a lock name owns: FNV-1a, fixed so that every version of leaderrun agrees.
/// Two names on one byte only share a queue (a spurious wake-up, never a wrong lease).
pub fn offset_of(lock: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in lock.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // Past byte 0 (the touch writes there), within what every filesystem's locks accept.
    1 + (hash >> 2) as i64 % (i64::MAX / 4)
}

fn byte_lock(kind: libc::c_short, offset: i64) -> libc::flock {
    // SAFETY: flock is plain integers, for which all-zero is valid (l_pid must be 0 for OFD locks).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset;
    lock.l_len = 1;
    lock
}

/// Queue for the byte at `offset`: blocks until this file description holds it.
pub fn lock_wait(file: &File, offset: i64) -> nix::Result<()> {
    loop {
        match fcntl(file.as_fd(), FcntlArg::F_OFD_SETLKW(&byte_lock(libc::F_WRLCK as _, offset))) {
            Err(Errno::EINTR) => continue,
            other => return other.map(drop),
        }
    }
}

/// Take the byte at `offset` if nobody holds it or queues ahead; `false` if taken.
pub fn try_lock(file: &File, offset: i64) -> nix::Result<bool> {
    match fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&byte_lock(libc::F_WRLCK as _, offset))) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Let the byte at `offset` go: the kernel hands it to one queued waiter.
pub fn unlock(file: &File, offset: i64) {
    // Failing only with a bad descriptor or argument; closing the file drops the lock anyway.
    let _ = fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&byte_lock(libc::F_UNLCK as _, offset)));
}

/// Tell a waiter watching the file (see `Watch`) that a lock was freed.
pub fn touch(file: &File) -> io::Result<()> {
    file.write_at(&[0], 0).map(drop)
}

/// An inotify watch for writes to the sidecar, readable in tokio.
pub struct Watch {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
}

impl Watch {
    pub fn new(sidecar: &Path) -> io::Result<Self> {
        let name = std::ffi::CString::new(sidecar.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: plain system calls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by inotify_init1 and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), name.as_ptr(), libc::IN_MODIFY) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is open and owned by the AsyncFd for its whole life.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(Self { fd: fd.map_err(|err| err.into_parts().1)? })
    }

    /// Wait until the file was written to since the watch began (or the watch broke:
    /// the file was removed). Events are not read: a watch serves one wake-up.
    pub async fn written(&self) {
        // An error here (the reactor is gone) ends the wait like an event: the caller re-reads.
        let _ = self.fd.readable().await;
    }
}
