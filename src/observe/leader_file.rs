//! `--leader-file PATH`: while this run leads, PATH holds `{"lock", "identity", "token",
//! "since"}` as JSON (Choria's `election file`, with the lease's details). It is replaced whole
//! (written beside it, then renamed), so a reader never sees half of it, and removed when
//! leadership ends: when the lease stops being trusted, or before it is released. If
//! leaderrun dies or freezes, its watchdog removes it as it stops the child.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{Event, Observer};

#[derive(Debug)]
pub struct LeaderFile {
    path: PathBuf,
}

impl LeaderFile {
    /// Check that PATH can be kept: its directory exists. Nothing is written yet.
    pub fn new(path: PathBuf) -> Result<Self, String> {
        let dir = match path.parent() {
            Some(dir) if dir.as_os_str().is_empty() => Path::new("."),
            Some(dir) => dir,
            None => return Err(format!("--leader-file {} names no file", path.display())),
        };
        if path.file_name().is_none() || !dir.is_dir() {
            return Err(format!("--leader-file {}: no directory {} to keep it in", path.display(), dir.display()));
        }
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, text: &str) {
        let mut next = self.path.clone().into_os_string();
        next.push(".next");
        let next = PathBuf::from(next);
        let written = fs::File::create(&next)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| fs::rename(&next, &self.path));
        if let Err(err) = written {
            let _ = fs::remove_file(&next);
            tracing::warn!("cannot write the leader file {}: {err}", self.path.display());
        }
    }

    fn remove(&self) {
        match fs::remove_file(&self.path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!("cannot remove the leader file {}: {err}", self.path.display())
            }
            _ => {}
        }
    }
}

impl Observer for LeaderFile {
    fn event(&self, event: &Event<'_>) {
        match event {
            Event::Elected { lease, slot, .. } => {
                let since = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                let text = serde_json::json!({
                    "lock": lease.lock,
                    "slot": slot,
                    "identity": lease.identity,
                    "token": lease.token,
                    "since": since,
                });
                self.write(&format!("{text}\n"));
            }
            Event::SteppingDown | Event::Released | Event::Stopping => self.remove(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lease;

    #[test]
    fn it_holds_the_lease_while_leading_and_goes_when_leadership_ends() {
        let dir = tempfile::tempdir().unwrap();
        let file = LeaderFile::new(dir.path().join("leader.json")).unwrap();
        let lease = Lease { lock: "report".into(), identity: "h:1:a".into(), token: 4 };
        file.event(&Event::Elected { lease: &lease, slot: 0, stop_at: std::time::Duration::from_secs(9) });
        let value: serde_json::Value = serde_json::from_str(&fs::read_to_string(file.path()).unwrap()).unwrap();
        assert_eq!((value["lock"].as_str(), value["token"].as_u64()), (Some("report"), Some(4)));
        assert_eq!(value["identity"], "h:1:a");
        assert!(value["since"].as_str().unwrap().ends_with('Z'));
        file.event(&Event::SteppingDown);
        assert!(!file.path().exists());
        assert!(LeaderFile::new(dir.path().join("no/such/dir/leader.json")).unwrap_err().contains("no directory"));
    }
}
