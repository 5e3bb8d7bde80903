//! The child's environment: leaderrun's own, without any LEADERRUN_* variable, plus the
//! variables leaderrun sets for the child.
//!
//! leaderrun reads its configuration from LEADERRUN_* variables (systemd units, cron and CI
//! set them). Passed on, they would configure a leaderrun the child starts: a nested run
//! would take --slots 3 or --wait from its parent and not from its own flags; and
//! LEADERRUN_STORE may hold a password. So every inherited LEADERRUN_* name is dropped,
//! known or not, and the child's LEADERRUN_* variables are exactly those leaderrun sets.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// The prefix of every variable leaderrun reads or sets.
const PREFIX: &[u8] = b"LEADERRUN_";

/// This process's environment less its LEADERRUN_* variables, then `set` (which also
/// replaces an inherited variable of the same name).
pub fn for_child(set: &[(&str, String)]) -> Vec<(OsString, OsString)> {
    for_child_from(std::env::vars_os(), set)
}

fn for_child_from(
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    set: &[(&str, String)],
) -> Vec<(OsString, OsString)> {
    let mut all: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(name, _)| !name.as_bytes().starts_with(PREFIX))
        .filter(|(name, _)| !set.iter().any(|(n, _)| OsStr::new(n) == name))
        .collect();
    all.extend(set.iter().map(|(name, value)| (OsString::from(name), OsString::from(value))));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        vars.iter().map(|(n, v)| (OsString::from(n), OsString::from(v))).collect()
    }

    #[test]
    fn leaderrun_variables_are_only_those_set_for_the_child() {
        let inherited = pairs(&[
            ("PATH", "/bin"),
            ("LEADERRUN_STORE", "postgres://u:secret@db/x"),
            ("LEADERRUN_SLOTS", "3"),
            ("LEADERRUN_LOCK", "parent"),
            ("LEADERRUN_NOT_YET_AN_OPTION", "x"),
            ("HOME", "/root"),
            ("EDITOR", "vi"),
        ]);
        let set = [("LEADERRUN_LOCK", "child".to_string()), ("EDITOR", "ed".to_string())];
        let got = for_child_from(inherited, &set);
        assert_eq!(got, pairs(&[("PATH", "/bin"), ("HOME", "/root"), ("LEADERRUN_LOCK", "child"), ("EDITOR", "ed")]));
    }
}
