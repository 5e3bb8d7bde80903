//! Lock names as KV keys: a name that is a valid key is the key itself, any other is `=`
//! followed by the unpadded base64url of its UTF-8.

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= (B64.iter().position(|b| b == c)? as u32) << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// The KV key of a lock name: verbatim if it is a valid key not starting with `=`, else
/// `=` + base64url (no padding) of its UTF-8. Injective: `=` starts only encoded keys.
pub(super) fn key_of(lock: &str) -> String {
    let plain = !lock.is_empty()
        && !lock.starts_with(['=', '.'])
        && !lock.ends_with('.')
        && !lock.contains("..")
        && lock.bytes().all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b));
    if plain {
        lock.to_string()
    } else {
        format!("={}", base64url(lock.as_bytes()))
    }
}

/// The lock name of a KV key (a key leaderrun did not encode is shown as it is).
pub(super) fn lock_of(key: &str) -> String {
    key.strip_prefix('=')
        .and_then(unbase64url)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|lock| key_of(lock) == key)
        .unwrap_or_else(|| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for lock in ["my_app", "nightly-report", "a/b.c=d", "x"] {
            assert_eq!(key_of(lock), lock);
        }
        let awkward = ["", "=x", ".x", "x.", "a..b", "with space", "ünï", "*", ">", "a\\b", "%_", &"é".repeat(255)];
        for lock in awkward {
            let key = key_of(lock);
            assert!(key.starts_with('=') && key[1..].bytes().all(|b| B64.contains(&b)), "{lock:?} -> {key:?}");
            assert_eq!(lock_of(&key), lock);
        }
        assert_eq!(lock_of("=not base64!"), "=not base64!");
        assert_eq!(lock_of("plain"), "plain");
        for n in 0..10 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 200) as u8).collect();
            assert_eq!(unbase64url(&base64url(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64url(b"hello?"), "aGVsbG8_");
    }
}
