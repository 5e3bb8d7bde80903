//! Starting the child inside its cgroup from the first instant (`clone3` with
//! `CLONE_INTO_CGROUP`, Linux 5.7).
//!
//! The other way, a forked child writing its pid to `cgroup.procs` before exec, makes the
//! kernel take its cgroup thread-group lock for writing, which waits for an RCU grace period:
//! 8–20 ms on these machines (strace -T on the write), paid on every start, so most of a
//! clean handoff. A process created in the cgroup never moves, and creating it takes that
//! lock only for reading.
//!
//! The new process is a fork-like copy of this one (no `CLONE_VM`), so between clone and
//! exec it makes only async-signal-safe system calls on memory prepared beforehand: no
//! allocation, no locks. What std's spawn does there, it does too: the signal mask emptied,
//! SIGPIPE back to its default (Rust ignores it), a process group of its own; and it makes
//! the same calls the supervisor's other path makes (tell the watchdog its group, check that
//! the lease's stop time has not passed, take the terminal). Over a close-on-exec pipe it
//! writes a mark just before its exec, and an errno if something failed: no mark at all
//! means it was killed before its program ran.
//!
//! Where `clone3` is refused (an older kernel, a seccomp profile answering ENOSYS or
//! EPERM), `spawn` says so and the supervisor falls back to std's spawn and the move.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use super::command::CommandSpec;

/// `struct clone_args` of linux/sched.h (version 2, 88 bytes: with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Everything the new process needs, made before the clone (it may not allocate).
pub struct Exec {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Exec {
    /// The command with exactly `environment` (`environment::for_child`).
    pub fn new(command: &CommandSpec, environment: &[(OsString, OsString)]) -> io::Result<Self> {
        let c = |s: &OsStr| CString::new(s.as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
        let mut argv = vec![c(&command.program)?];
        for arg in &command.args {
            argv.push(c(arg)?);
        }
        let mut envp = Vec::new();
        for (name, value) in environment {
            let mut entry = name.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            envp.push(c(OsStr::from_bytes(&entry))?);
        }
        Ok(Self { path: c(command.path.as_os_str())?, argv, envp })
    }
}

/// A child started here: its pid, and a pidfd to wait for it on tokio.
pub struct Started {
    pub pid: u32,
    pidfd: OwnedFd,
}

/// Why no child was started.
pub enum NotStarted {
    /// This kernel (or a seccomp profile) refuses `clone3` into a cgroup: use another way.
    Unsupported(io::Error),
    /// The process was made but its program could not be run (the errno of exec).
    Exec(io::Error),
    /// Something else failed (the pipe, the clone itself).
    Other(io::Error),
}

/// Start `exec` inside the cgroup open (O_DIRECTORY) on `cgroup`, in a process group of
/// its own, telling the watchdog on `announce` and taking the terminal if `terminal`; not
/// at all once CLOCK_BOOTTIME reaches `start_by` (`NotStarted::Exec` with ETIMEDOUT).
pub fn spawn_into(
    exec: &Exec,
    cgroup: RawFd,
    announce: Option<RawFd>,
    terminal: bool,
    start_by: Duration,
) -> Result<Started, NotStarted> {
    let argv: Vec<*const libc::c_char> =
        exec.argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: Vec<*const libc::c_char> =
        exec.envp.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let (failed_read, failed_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| NotStarted::Other(io::Error::from_raw_os_error(e as i32)))?;
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_CLEAR_SIGHAND | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup as u64,
        ..Default::default()
    };
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack): the child runs on a copy of this
    // thread's memory and, below, only makes async-signal-safe calls on data made above.
    let pid = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::addr_of!(args), std::mem::size_of::<CloneArgs>()) };
    if pid == 0 {
        // SAFETY: in the new process, between clone and exec; see child_execs.
        unsafe { child_execs(exec, &argv, &envp, failed_write.as_raw_fd(), announce, terminal, start_by) }
    }
    if pid < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::E2BIG | libc::EOPNOTSUPP) => {
                NotStarted::Unsupported(err)
            }
            _ => NotStarted::Other(err),
        });
    }
    drop(failed_write);
    // SAFETY: CLONE_PIDFD stored a new descriptor owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // The mark (one byte, just before exec), then an errno (4 bytes) if something failed.
    let mut report = [0u8; 5];
    let mut file = std::fs::File::from(failed_read);
    match read_full(&mut file, &mut report).map_err(NotStarted::Other)? {
        // The mark, and the pipe closed on exec: the program runs.
        1 => Ok(Started { pid: pid as u32, pidfd }),
        // Closed with no mark: the process died (SIGKILLed: the watchdog, past the
        // deadline) before its program could run. Reap it so no zombie is left.
        0 => {
            let _ = reap_now(&pidfd);
            Err(NotStarted::Exec(io::Error::other(KilledBeforeExec)))
        }
        n => {
            let errno = <[u8; 4]>::try_from(&report[n.saturating_sub(4)..n]).unwrap_or_default();
            // The process exits at once (127); reap it so no zombie is left.
            let _ = reap_now(&pidfd);
            Err(NotStarted::Exec(io::Error::from_raw_os_error(i32::from_ne_bytes(errno))))
        }
    }
}

/// The new process died before its program's exec (killed: nothing else ends it there), so
/// its program never ran. A pipe that closes with no error on it cannot tell this from an
/// exec, hence the mark the new process writes just before its exec.
#[derive(Debug, thiserror::Error)]
#[error("the child was killed before its program could run")]
pub struct KilledBeforeExec;

/// Whether `err` says the new process was killed before its program ran.
pub fn killed_before_exec(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|inner| inner.is::<KilledBeforeExec>())
}

/// The mark for std's spawn, which has its own error pipe: a close-on-exec pipe that the new
/// process writes one byte to, last before its exec (`write_end`, in a `pre_exec`).
pub struct ExecMark {
    read: std::fs::File,
    write: OwnedFd,
}

impl ExecMark {
    pub fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        Ok(Self { read: read.into(), write })
    }

    pub fn write_end(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// In the new process, last before its exec: one write(2).
    pub fn mark(fd: RawFd) -> io::Result<()> {
        // SAFETY: writes one byte from a valid buffer; async-signal-safe.
        match unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) } {
            1 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Once std's spawn returned the process: whether it reached its exec (the mark came).
    pub fn reached_exec(self) -> io::Result<bool> {
        let Self { mut read, write } = self;
        drop(write);
        Ok(read_full(&mut read, &mut [0u8; 1])? == 1)
    }
}

/// Read until `buf` is full or the pipe closes; the count read.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    use std::io::Read;
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The new process's side: set up, exec, and on failure report the errno and exit 127.
///
/// # Safety
/// Only between clone and exec in the new process: every call here is async-signal-safe
/// and touches only memory prepared before the clone.
unsafe fn child_execs(
    exec: &Exec,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    failed: RawFd,
    announce: Option<RawFd>,
    terminal: bool,
    start_by: Duration,
) -> ! {
    let mut empty: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut empty);
    libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    let mut ok = libc::setpgid(0, 0) == 0;
    if ok {
        if let Some(fd) = announce {
            ok = super::watchdog::announce_from_child(fd).is_ok();
        }
    }
    if ok && !in_time(start_by) {
        *libc::__errno_location() = libc::ETIMEDOUT;
        ok = false;
    }
    if ok && terminal {
        let _ = super::terminal::take_foreground();
    }
    if ok {
        let _ = ExecMark::mark(failed);
        libc::execve(exec.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
    let errno = *libc::__errno_location();
    let errno = if errno == 0 { libc::EIO } else { errno };
    libc::write(failed, errno.to_ne_bytes().as_ptr().cast(), 4);
    libc::_exit(127)
}

/// Whether CLOCK_BOOTTIME is still short of `start_by`: the last check before the child's
/// program runs, in the new process itself. The elector checked the same instant when the
/// grant came, but this host may freeze or starve the run between there and here (a SIGSTOP,
/// a saturated CPU) for longer than the lease: a child that ran then could overlap the next
/// holder's. From here on the watchdog, which already knows the child's group, enforces the
/// deadline. Async-signal-safe: one clock_gettime, no allocation.
pub fn in_time(start_by: Duration) -> bool {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-parameter; clock_gettime is async-signal-safe.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return false;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32) < start_by
}

/// Reap a child that has exited (or is about to): waitid on its pidfd, blocking.
fn reap_now(pidfd: &OwnedFd) -> io::Result<ExitStatus> {
    loop {
        // SAFETY: a zeroed siginfo_t is valid for waitid to fill in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the pidfd is open; `info` is a valid out-parameter.
        let rc = unsafe { libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED) };
        if rc == 0 {
            return Ok(status_of(&info));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The wait status waitid reported, as std's ExitStatus.
fn status_of(info: &libc::siginfo_t) -> ExitStatus {
    // SAFETY: waitid filled in a SIGCHLD siginfo, whose si_status is valid.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => ExitStatus::from_raw((status & 0xff) << 8),
        libc::CLD_DUMPED => ExitStatus::from_raw(status | 0x80),
        _ => ExitStatus::from_raw(status),
    }
}

impl Started {
    /// Wait (on tokio) until the child exits, and reap it.
    pub async fn wait(self) -> io::Result<ExitStatus> {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open (and the same descriptor)
        // until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(self.pidfd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let _ready = fd.readable().await?;
        reap_now(fd.get_ref())
    }
}
