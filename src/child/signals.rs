//! Signal names, and which signals leaderrun relays to the child.

use nix::sys::signal::Signal;

/// Signals sent to leaderrun that are forwarded to the child's process group.
pub const FORWARDED: [Signal; 6] =
    [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2];

/// Of those, the ones after which leaderrun also escalates to SIGKILL after --kill-after.
pub fn ends_the_run(signal: Signal) -> bool {
    matches!(signal, Signal::SIGINT | Signal::SIGTERM)
}

/// Parse `TERM`, `SIGTERM`, `sigterm` or `15`.
pub fn parse_signal(text: &str) -> Result<Signal, String> {
    let trimmed = text.trim();
    if let Ok(n) = trimmed.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("{n} is not a signal number"));
    }
    let upper = trimmed.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    name.parse::<Signal>().map_err(|_| format!("unknown signal {trimmed:?} (write e.g. TERM, INT, HUP or 15)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("sigint"), Ok(Signal::SIGINT));
        assert_eq!(parse_signal("9"), Ok(Signal::SIGKILL));
        assert!(parse_signal("NOPE").unwrap_err().contains("unknown signal"));
        assert!(parse_signal("999").unwrap_err().contains("not a signal"));
    }
}
