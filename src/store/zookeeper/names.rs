//! Lock names as node names, and the lease children's names.

use crate::store::url::percent_decode_bytes;

/// Name of the lease children, before the sequence number.
pub(super) const LEASE_PREFIX: &str = "lease-";

/// Characters ZooKeeper refuses in a path (its `PathUtils.validatePath`; Java sees a character
/// above U+FFFF as two surrogates, which it refuses too).
pub(super) fn refused_by_zookeeper(c: char) -> bool {
    matches!(c as u32, 0..=0x1f | 0x7f..=0x9f | 0xd800..=0xf8ff | 0xfff0..)
}

/// A lock name as a node name: `%`, `/` and what ZooKeeper refuses become `%XX` (UTF-8 bytes),
/// and so does the `.` of the names `.` and `..`. Injective, undone by `decode`.
pub(super) fn encode(lock: &str) -> String {
    let mut out = String::with_capacity(lock.len());
    for c in lock.chars() {
        if c == '%' || c == '/' || refused_by_zookeeper(c) || (c == '.' && (lock == "." || lock == "..")) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A node name back to the lock name (`None` if it is not one `encode` makes).
pub(super) fn decode(name: &str) -> Option<String> {
    let decoded = String::from_utf8(percent_decode_bytes(name)).ok()?;
    (encode(&decoded) == name).then_some(decoded)
}

/// The sequence number of a lease child's name.
pub(super) fn sequence(name: &str) -> Option<i64> {
    name.strip_prefix(LEASE_PREFIX).and_then(|n| n.parse::<i64>().ok()).filter(|n| *n >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_round_trip() {
        let names = [
            "plain",
            "it's \"quoted\"",
            "ünïcødé 日本語",
            "a/b",
            "100% _",
            ".",
            "..",
            "...",
            ".hidden",
            "emoji 🦀",
            "del\u{7f}",
            "back\\slash",
            "trailing ",
        ];
        for name in names {
            let node = encode(name);
            assert!(!node.contains('/') && node != "." && node != "..", "{node:?}");
            assert!(!node.chars().any(refused_by_zookeeper), "{node:?}");
            assert_eq!(decode(&node).as_deref(), Some(name), "{node:?}");
        }
        assert_eq!(encode("a/b%c"), "a%2Fb%25c");
        assert_eq!(encode(".."), "%2E%2E");
        assert_ne!(encode("x"), encode("X"));
        assert_eq!(decode("a%2fb"), None, "only the encoder's own spelling decodes");
    }

    #[test]
    fn sequences() {
        assert_eq!(sequence("lease-0000000041"), Some(41));
        assert_eq!(sequence("other"), None);
        assert_eq!(sequence("lease-x"), None);
    }
}
