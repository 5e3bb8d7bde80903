//! The command to run, found the way a shell finds it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use crate::payload::StartError;

/// The command to run, resolved before any lease is taken.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// As the user wrote it: becomes argv[0].
    pub program: OsString,
    /// Where PATH lookup found it.
    pub path: PathBuf,
    pub args: Vec<OsString>,
}

impl CommandSpec {
    /// Find `program` the way a shell does, so that "not found" (127) and "not
    /// executable" (126) are known before anything is written to the store.
    pub fn resolve(program: OsString, args: Vec<OsString>) -> Result<Self, StartError> {
        let shown = program.to_string_lossy().into_owned();
        if program.is_empty() {
            return Err(StartError::NotFound(shown));
        }
        let check = |path: &Path| -> Result<(), String> {
            if path.is_dir() {
                return Err("is a directory".into());
            }
            access(path, AccessFlags::X_OK).map_err(|e| e.desc().to_string())
        };
        if program.as_bytes().contains(&b'/') {
            let path = PathBuf::from(&program);
            if !path.exists() {
                return Err(StartError::NotFound(shown));
            }
            check(&path).map_err(|why| StartError::NotExecutable(shown.clone(), why))?;
            return Ok(Self { program, path, args });
        }
        let search = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
        let mut refused = None;
        for dir in std::env::split_paths(&search) {
            let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
            let candidate = dir.join(&program);
            if candidate.is_file() {
                match check(&candidate) {
                    Ok(()) => return Ok(Self { program, path: candidate, args }),
                    Err(why) => refused = refused.or(Some(why)),
                }
            }
        }
        Err(match refused {
            Some(why) => StartError::NotExecutable(shown, why),
            None => StartError::NotFound(shown),
        })
    }
}
