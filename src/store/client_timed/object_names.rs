//! Lock names as object names, for the stores that keep one object per lock under a prefix
//! (S3 keys, Cloud Storage object names): `%` written `%25`, `/` written `%2F`, a leading
//! `.` written `%2E`, and whatever else a store must escape written `%XX`; every other
//! character stays as it is. Decoding turns each `%XX` back into its byte, so two lock
//! names never share an object, a name never reaches into a "folder" below the prefix,
//! and names starting with `.` (a store's own probe objects) are never locks.

/// `prefix` + `lock` encoded; `escape` names the characters the store wants written `%XX`
/// besides the three every store escapes.
pub fn encode(prefix: &str, lock: &str, escape: impl Fn(char) -> bool) -> String {
    let mut name = String::with_capacity(prefix.len() + lock.len());
    name.push_str(prefix);
    for (i, c) in lock.chars().enumerate() {
        match c {
            '%' => name.push_str("%25"),
            '/' => name.push_str("%2F"),
            '.' if i == 0 => name.push_str("%2E"),
            c if c.is_ascii() && escape(c) => name.push_str(&format!("%{:02X}", c as u8)),
            c => name.push(c),
        }
    }
    name
}

/// The lock name that `name` under `prefix` stands for, if it is a lock's object: only the
/// canonical spelling counts (`name_of`, the store's own encoding, must give `name` back),
/// so "a%41" is not "aA"'s object.
pub fn decode(prefix: &str, name: &str, name_of: impl Fn(&str) -> Option<String>) -> Option<String> {
    let encoded = name.strip_prefix(prefix)?;
    if encoded.is_empty() || encoded.starts_with('.') || encoded.contains('/') {
        return None;
    }
    let lock = String::from_utf8(crate::store::url::percent_decode_bytes(encoded)).ok()?;
    (name_of(&lock)? == name).then_some(lock)
}
