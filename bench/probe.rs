//! `leaderrun-probe`: the child the fault run and the benchmarks put under leaderrun.
//!
//! It appends `START id token t`, `BEAT id t` every --beat and `STOP id t` lines to a
//! shared log, `t` being CLOCK_MONOTONIC nanoseconds (comparable across processes on
//! one host). The moment it starts it also tries a non-blocking flock(2) on a shared
//! file and holds it for its whole life: failing to get it means another probe is
//! running right now, an overlap caught in the act (logged as `OVERLAP id token t`).
//! It stops on SIGTERM, SIGINT or SIGHUP (logging STOP), or by itself after --run-for.
//! Under `--slots` (a --lockfile naming `{slot}`), the flock is on the file of its slot
//! (LEADERRUN_SLOT), and START carries the slot too: `START id token t slot`.
//! A test instrument, not part of leaderrun: install leaderrun alone with
//! `cargo install --path . --bin leaderrun`.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

fn now_ns() -> u128 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u128 * 1_000_000_000 + ts.tv_nsec() as u128
}

struct Args {
    log: String,
    lockfile: String,
    id: String,
    beat: Duration,
    run_for: Option<Duration>,
    exit_code: i32,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        log: String::new(),
        lockfile: String::new(),
        id: String::new(),
        beat: Duration::from_millis(50),
        run_for: None,
        exit_code: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--log" => args.log = value()?,
            "--lockfile" => args.lockfile = value()?,
            "--id" => args.id = value()?,
            "--beat" => args.beat = humantime::parse_duration(&value()?).map_err(|e| e.to_string())?,
            "--run-for" => args.run_for = Some(humantime::parse_duration(&value()?).map_err(|e| e.to_string())?),
            "--exit" => args.exit_code = value()?.parse().map_err(|_| "--exit needs a number")?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.log.is_empty() || args.lockfile.is_empty() {
        return Err(
            "usage: leaderrun-probe --log FILE --lockfile FILE [--id ID] [--beat DUR] [--run-for DUR] [--exit N]"
                .into(),
        );
    }
    Ok(args)
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("leaderrun-probe: {e}");
            std::process::exit(2);
        }
    };
    // Block the stop signals first, then wait for them with a timeout: no handler races.
    let mut set = nix::sys::signal::SigSet::empty();
    for s in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().expect("sigprocmask");

    let started = now_ns();
    let token = std::env::var("LEADERRUN_FENCING_TOKEN").unwrap_or_else(|_| "-".into());
    let mut log = OpenOptions::new().create(true).append(true).open(&args.log).expect("open --log");
    let slot = std::env::var("LEADERRUN_SLOT").unwrap_or_else(|_| "0".into());
    let per_slot = args.lockfile.contains("{slot}");
    let lockfile = args.lockfile.replace("{slot}", &slot);
    let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lockfile).expect("open --lockfile");
    // SAFETY: flock on a file descriptor we own.
    let got = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    let id = &args.id;
    let mut line = |text: String| {
        // One write per line: O_APPEND keeps lines from different processes whole.
        let _ = log.write_all(text.as_bytes());
    };
    if per_slot {
        line(format!("START {id} {token} {started} {slot}\n"));
    } else {
        line(format!("START {id} {token} {started}\n"));
    }
    if !got {
        line(format!("OVERLAP {id} {token} {}\n", now_ns()));
    }
    let deadline = args.run_for.map(|d| started + d.as_nanos());
    loop {
        let wait = match deadline {
            Some(end) => {
                let now = now_ns();
                if now >= end {
                    line(format!("STOP {id} {}\n", now_ns()));
                    std::process::exit(args.exit_code);
                }
                args.beat.min(Duration::from_nanos((end - now) as u64))
            }
            None => args.beat,
        };
        let timeout =
            libc::timespec { tv_sec: wait.as_secs() as libc::time_t, tv_nsec: wait.subsec_nanos() as libc::c_long };
        // SAFETY: waits for one of the blocked signals in `set`, or the timeout.
        let signal = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
        if signal > 0 {
            line(format!("STOP {id} {}\n", now_ns()));
            std::process::exit(128 + signal);
        }
        line(format!("BEAT {id} {}\n", now_ns()));
    }
}
