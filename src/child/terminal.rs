//! Sharing a terminal with the child.
//!
//! The child runs in a process group of its own, so that signals reach its whole
//! tree. On a terminal that would make it a background job: reading the terminal
//! would stop it with SIGTTIN and Ctrl-C would reach only leaderrun. So when
//! leaderrun itself is the terminal's foreground job, it hands the terminal to the
//! child's group for the child's lifetime and takes it back afterwards, as a shell
//! does with its jobs. In cron, CI and containers there is no terminal and nothing
//! here happens.

use std::os::fd::BorrowedFd;

/// Whether leaderrun is the foreground job of the terminal on its stdin.
pub fn in_foreground() -> bool {
    // SAFETY: fd 0 is open for the life of the process (or the calls fail harmlessly).
    let stdin = unsafe { BorrowedFd::borrow_raw(0) };
    nix::unistd::isatty(stdin).unwrap_or(false)
        && nix::unistd::tcgetpgrp(stdin).is_ok_and(|pgrp| pgrp == nix::unistd::getpgrp())
}

/// Make the calling process's group the terminal's foreground group, with SIGTTOU
/// blocked (a background group asking for the terminal would otherwise be stopped).
/// Only async-signal-safe calls: it also runs between fork and exec.
pub fn take_foreground() -> std::io::Result<()> {
    // SAFETY: plain system calls on a local signal set; no allocation.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        let result = libc::tcsetpgrp(0, libc::getpgrp());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if result == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
