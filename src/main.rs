use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use leaderrun::{child::watchdog, cli, exit, run};

fn main() -> ExitCode {
    // Users see one line, never a backtrace, even with RUST_BACKTRACE=1.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("leaderrun: internal error: {message}{place} (please report it)");
    }));

    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == watchdog::ARG) {
        let rest: Vec<String> = args[2..].iter().map(|a| a.to_string_lossy().into_owned()).collect();
        return ExitCode::from(watchdog::main(&rest));
    }
    let cli = match cli::parse(args) {
        cli::Parsed::Cli(cli) => cli,
        cli::Parsed::Exit { message, to_stdout, code } => {
            if to_stdout {
                let _ = std::io::stdout().write_all(message.as_bytes());
            } else {
                eprintln!("leaderrun: error: {}", message.trim_end());
            }
            return ExitCode::from(code);
        }
    };
    // Only a run starts a child; it forks its watchdog now, while leaderrun is still one
    // thread, which is the only time a fork may go on running Rust code (see
    // child/watchdog/early.rs). The watchdog process returns here when it is done.
    if cli.subcommand.is_none() {
        if let Some(code) = watchdog::start_early() {
            // Exit without dropping anything: the pages it shares with leaderrun stay shared.
            std::process::exit(i32::from(code));
        }
    }
    let ran = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| runtime.block_on(run::main(*cli)));
    // A run that started no child leaves no watchdog behind.
    watchdog::dismiss_unused();
    match ran {
        Ok(code) => ExitCode::from(code),
        // leaderrun's own trouble, with its causes on one line: "cannot write to standard
        // output: No space left on device".
        Err(err) => {
            eprintln!("leaderrun: error: {err:#}");
            ExitCode::from(exit::INTERNAL)
        }
    }
}
