//! The embedded store as the registry lists it: `sqlite://` URLs, the default file when no
//! `--store` is given, and what the run knows of it before it opens the file.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::{SqliteStore, SCHEMA};
use crate::store::kind::{StoreKind, StoreSpec};
use crate::store::{Access, Result, Store, StoreError};

pub const KIND: StoreKind = StoreKind {
    name: "sqlite",
    schemes: &["sqlite"],
    usage: "sqlite:///path/file.db",
    url: "sqlite:///path/to/file.db",
    help: "The embedded default: one file, one host, any number of processes. Each step is one SQL statement \
           under SQLite's write lock; expiry is judged on CLOCK_BOOTTIME and a lease from before a reboot is \
           void, which needs the kernel's boot id (/proc/sys/kernel/random/boot_id): without it the store is \
           refused (69). An acquisition is synced to disk before it counts, so a power loss cannot repeat a \
           fencing token. Waiters queue in the kernel on FILE-wake beside it instead of polling. Never put the \
           file on a network filesystem. Deleting the file under a holder frees its lock and restarts tokens.",
    parse: |url| parse(url).map(|file| Box::new(file) as Box<dyn StoreSpec>),
};

/// An SQLite file; `default` when no --store was given (its directory is made on first use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteFile {
    pub path: PathBuf,
    pub default: bool,
}

/// `sqlite:///abs/path`, `sqlite://rel/path` and `sqlite:path` all name a file; the URL
/// takes no parameters.
pub fn parse(url: &str) -> std::result::Result<SqliteFile, String> {
    let rest = url.split_once(':').map_or("", |(_, rest)| rest);
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if let Some((_, query)) = path.split_once('?') {
        let key = query.split(['=', '&']).next().unwrap_or_default();
        return Err(format!("unknown parameter ?{key}= (an sqlite:// URL takes none)"));
    }
    if path.is_empty() || path.ends_with('/') {
        return Err("it names no file (expected e.g. sqlite:///path/to/file.db)".into());
    }
    Ok(SqliteFile { path: PathBuf::from(path), default: false })
}

/// The file used when no `--store` is given: `leaderrun.db` in the state directory.
pub fn default_file(state_dir: PathBuf) -> SqliteFile {
    SqliteFile { path: state_dir.join("leaderrun.db"), default: true }
}

/// The state directory for the embedded store: $XDG_STATE_HOME/leaderrun, else
/// ~/.local/state/leaderrun; /var/lib/leaderrun for root.
pub fn default_state_dir() -> std::result::Result<PathBuf, String> {
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/leaderrun"));
    }
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").and_then(absolute) {
        return Ok(dir.join("leaderrun"));
    }
    match std::env::var_os("HOME").and_then(absolute) {
        Some(home) => Ok(home.join(".local/state/leaderrun")),
        None => {
            Err("no state directory: neither XDG_STATE_HOME nor HOME is set; give --store sqlite:///path/to/file.db"
                .into())
        }
    }
}

#[async_trait]
impl StoreSpec for SqliteFile {
    fn shown(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    async fn open(&self, access: Access) -> Result<Box<dyn Store>> {
        if self.default && access == Access::Create {
            create_state_dir(self.path.parent().unwrap_or(Path::new(".")))?;
        }
        Ok(Box::new(SqliteStore::open(&self.path, access).await?))
    }

    fn setup_text(&self) -> Option<String> {
        Some(SCHEMA.to_string())
    }

    /// Expiry is judged on this host's CLOCK_BOOTTIME.
    fn expiry_on_server_wall_clock(&self) -> bool {
        false
    }
}

fn create_state_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::refused(format!("cannot create state directory {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls() {
        let p = |u| parse(u).map(|f| (f.path, f.default)).unwrap();
        assert_eq!(p("sqlite:///a/b.db"), ("/a/b.db".into(), false));
        assert_eq!(p("sqlite://rel/b.db"), ("rel/b.db".into(), false));
        assert_eq!(p("sqlite:b.db"), ("b.db".into(), false));
        assert_eq!(default_file("/state".into()), SqliteFile { path: "/state/leaderrun.db".into(), default: true });
        assert!(parse("sqlite://").unwrap_err().contains("names no file"));
        let err = parse("sqlite:///a/b.db?mode=ro").unwrap_err();
        assert!(err.contains("unknown parameter ?mode="), "{err}");
    }
}
