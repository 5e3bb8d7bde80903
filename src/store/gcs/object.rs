//! One object per lock: its name, its record (a small JSON document kept in the object's
//! custom metadata, so that a metadata read or a listing carries it), and the multipart
//! upload that writes both.
//!
//! Names: `PREFIX` + the lock name with `%` written `%25`, `/` written `%2F`, a leading
//! `.` written `%2E`, and control characters (Cloud Storage refuses line breaks in names)
//! written `%XX`; every other character stays as it is (names are UTF-8). Decoding turns
//! each `%XX` back into its byte, so two lock names never share an object, a name never
//! reaches into a "folder" below the prefix, and names starting with `.` (the
//! conditional-write probe) are never locks. The same scheme as the S3 store's keys.
//!
//! Every upload makes a new generation, so every write changes the version (`G/M`), even
//! one that writes the same record again: no write counter is needed (S3 needs one).

pub use crate::store::client_timed::document::Document as Body;
use crate::store::client_timed::object_names;

/// The longest object name Cloud Storage accepts, in bytes of UTF-8.
const MAX_NAME_BYTES: usize = 1024;

/// The custom metadata key that holds the record.
pub const METADATA_KEY: &str = "leaderrun";

/// The object name of `lock` under `prefix`, or why it cannot have one (too long).
pub fn name_of(prefix: &str, lock: &str) -> Result<String, String> {
    // Cloud Storage refuses line breaks in names: every control character is escaped.
    let name = object_names::encode(prefix, lock, |c| c.is_ascii_control());
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "the object name for lock {lock:?} would be {} bytes long; Cloud Storage takes at most \
             {MAX_NAME_BYTES} (use a shorter lock name or prefix)",
            name.len()
        ));
    }
    Ok(name)
}

/// The lock name an object name under `prefix` stands for, if it is a lock's object.
pub fn lock_of(prefix: &str, name: &str) -> Option<String> {
    object_names::decode(prefix, name, |lock| name_of(prefix, lock).ok())
}

/// An object name as one segment of a URL path (`/o/NAME`): every byte but the unreserved
/// ones percent-encoded, `/` included, as the JSON API wants it.
pub fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len() * 3);
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A `multipart/related` upload (the JSON API's `uploadType=multipart`): the object's
/// resource (its name, content type and custom metadata) and its content. The only upload
/// kind whose preconditions every server honours (fake-gcs-server 1.54 ignores them on
/// media and resumable uploads).
pub struct Multipart {
    pub content_type: String,
    pub body: Vec<u8>,
}

/// The upload of object `name` whose metadata (and content, for people who download it)
/// is `record`, or any other `content`.
pub fn multipart(name: &str, metadata: Option<&str>, content: &[u8], content_type: &str) -> Multipart {
    let boundary = format!("leaderrun-{:016x}", rand::random::<u64>());
    let mut resource = serde_json::json!({ "name": name, "contentType": content_type });
    if let Some(value) = metadata {
        resource["metadata"] = serde_json::json!({ METADATA_KEY: value });
    }
    let mut body = Vec::with_capacity(content.len() * 2 + 256);
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{resource}\r\n").as_bytes(),
    );
    body.extend_from_slice(format!("--{boundary}\r\nContent-Type: {content_type}\r\n\r\n").as_bytes());
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    Multipart { content_type: format!("multipart/related; boundary={boundary}"), body }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::store::client_timed::Record;

    #[test]
    fn names_are_collision_free_and_decode_back() {
        let names = [
            "a",
            "a/b",
            "a%2Fb",
            "%",
            "%25",
            ".",
            "..",
            ".hidden",
            "x.",
            "日本語 spaces",
            "back\\slash",
            "a%41",
            "line\nbreak\r",
        ];
        let mut seen = std::collections::BTreeSet::new();
        for lock in names {
            let name = name_of("p/", lock).unwrap();
            assert!(name.starts_with("p/") && !name[2..].contains('/') && !name[2..].starts_with('.'), "{name}");
            assert!(!name.contains(['\r', '\n']), "{name:?}");
            assert_eq!(lock_of("p/", &name).as_deref(), Some(lock), "{name}");
            assert!(seen.insert(name), "{lock:?} shares a name");
        }
        assert_eq!(name_of("p/", "a/b%").unwrap(), "p/a%2Fb%25");
        assert_eq!(name_of("p/", "a\nb").unwrap(), "p/a%0Ab");
    }

    #[test]
    fn names_that_are_not_locks() {
        assert_eq!(lock_of("p/", "p/.conditional-write-probe"), None);
        assert_eq!(lock_of("p/", "p/sub/x"), None);
        assert_eq!(lock_of("p/", "q/x"), None);
        assert_eq!(lock_of("p/", "p/a%41"), None);
        assert_eq!(lock_of("p/", "p/%ff"), None);
        assert_eq!(lock_of("p/", "p/"), None);
        let too_long = "😀".repeat(255);
        assert!(name_of("leaderrun/", &too_long).unwrap_err().contains("at most 1024"));
    }

    #[test]
    fn path_segments_escape_everything_but_unreserved_bytes() {
        assert_eq!(path_segment("leaderrun/a%2Fb c"), "leaderrun%2Fa%252Fb%20c");
        assert_eq!(path_segment("é"), "%C3%A9");
    }

    #[test]
    fn bodies_round_trip() {
        let record = Record {
            holder: "host-1".into(),
            ttl_seconds: 15,
            acquired: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            renewed: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_005_456)),
            transitions: 3,
            token: Some(1_700_000_000_000_001),
            revoked: false,
            kept_until: None,
        };
        assert_eq!(Body::parse(Body::new(&record).to_json().as_bytes()).unwrap().record(), record);
        assert!(Body::parse(b"{}").unwrap_err().contains("not a leaderrun lock object"));
        let later = Body::new(&record).to_json().replace("\"leaderrun\":1", "\"leaderrun\":2");
        assert!(Body::parse(later.as_bytes()).unwrap_err().contains("layout 2"));
    }

    #[test]
    fn multipart_bodies_carry_the_resource_then_the_content() {
        let upload = multipart("p/x", Some("{\"a\":1}"), b"{\"a\":1}", "application/json");
        let boundary = upload.content_type.strip_prefix("multipart/related; boundary=").unwrap();
        let text = String::from_utf8(upload.body).unwrap();
        assert!(text.starts_with(&format!("--{boundary}\r\n")) && text.ends_with(&format!("--{boundary}--\r\n")));
        assert!(text.contains(r#""metadata":{"leaderrun":"{\"a\":1}"}"#), "{text}");
        assert!(text.contains(r#""name":"p/x""#), "{text}");
    }
}
