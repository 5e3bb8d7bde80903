//! Lock names as Lease names.
//!
//! A Lease's name must be a DNS-1123 subdomain: at most 253 characters, lower-case letters,
//! digits, '-' and '.', each dot-separated part starting and ending with a letter or digit.
//! A lock name that is one is used as it is, so `kubectl get lease NIGHTLY` and a client-go
//! elector configured with the same name see the same Lease. Any other lock name (capitals,
//! spaces, '/', too long...) becomes `HASHED_PREFIX` + the SHA-256 of the name in hex, and
//! the name itself goes into the `LOCK_ANNOTATION`, from which `leaderrun list` reads it
//! back. A verbatim name never starts with `HASHED_PREFIX` (such a lock name is hashed
//! too), so the two kinds never collide, and two hashed names collide only if SHA-256 does.

use sha2::{Digest, Sha256};

/// What every hashed Lease name starts with.
pub(super) const HASHED_PREFIX: &str = "leaderrun-sha256-";

/// The Lease's name for `lock`.
pub(super) fn lease_name(lock: &str) -> String {
    if is_dns_subdomain(lock) && !lock.starts_with(HASHED_PREFIX) {
        return lock.to_string();
    }
    let digest = Sha256::digest(lock.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASHED_PREFIX}{hex}")
}

/// The lock a Lease stands for: the annotated name if it hashes to this Lease's name, else
/// the Lease's own name (a Lease another client wrote). `None` for a hashed name whose
/// annotation was lost: its lock name cannot be known.
pub(super) fn lock_name(lease_name_: &str, annotated: Option<&str>) -> Option<String> {
    if let Some(lock) = annotated.filter(|lock| lease_name(lock) == lease_name_) {
        return Some(lock.to_string());
    }
    (!lease_name_.starts_with(HASHED_PREFIX)).then(|| lease_name_.to_string())
}

/// A DNS-1123 subdomain, as the API server checks object names.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_object_names_are_kept() {
        for name in ["nightly-report", "billing", "a.b-c.d", "x", "0abc", &"a".repeat(253)] {
            assert_eq!(lease_name(name), name);
            assert_eq!(lock_name(name, None).as_deref(), Some(name));
        }
    }

    #[test]
    fn other_names_are_hashed_and_read_back_from_the_annotation() {
        for lock in [
            "Nightly",
            "with space",
            "a/b",
            "-lead",
            "trail-",
            "a..b",
            ".x",
            "ünï",
            &"a".repeat(254),
            "leaderrun-sha256-0000",
        ] {
            let name = lease_name(lock);
            assert!(name.starts_with(HASHED_PREFIX) && is_dns_subdomain(&name) && name.len() == 81, "{lock}: {name}");
            assert_eq!(lock_name(&name, Some(lock)).as_deref(), Some(lock));
            assert_eq!(lock_name(&name, None), None, "a hashed name without its annotation is unknown");
            assert_eq!(lock_name(&name, Some("another")), None, "an annotation that does not hash to the name");
        }
        assert_ne!(lease_name("A"), lease_name("a"));
        assert_ne!(lease_name("A"), lease_name("B"));
        // A peer's annotation on a verbatim Lease does not rename it.
        assert_eq!(lock_name("billing", Some("other")).as_deref(), Some("billing"));
    }
}
