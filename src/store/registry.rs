//! The one list of stores. Every store describes itself in its own folder (`NAME/kind.rs`: a
//! `StoreKind`); this file is the only one that names them all, and no store imports it.
//! `--store`, its help, the STORES section of `--help` and the man page, the completions and
//! the scheme list in errors all read this list. Adding a store: its folder, one line in
//! `STORES` and `EVERY_STORE`, its Cargo feature and its test server.

use std::path::PathBuf;

use super::kind::{StoreKind, StoreSpec};
use super::url::redact;

/// The stores of this build, the embedded default first.
pub const STORES: &[&StoreKind] = &[
    #[cfg(feature = "sqlite")]
    &super::sqlite::KIND,
    #[cfg(feature = "postgres")]
    &super::postgres::KIND,
    #[cfg(feature = "mysql")]
    &super::mysql::KIND,
    #[cfg(feature = "redis")]
    &super::redis::KIND,
    #[cfg(feature = "etcd")]
    &super::etcd::KIND,
    #[cfg(feature = "nats")]
    &super::nats::KIND,
    #[cfg(feature = "zookeeper")]
    &super::zookeeper::KIND,
    #[cfg(feature = "kubernetes")]
    &super::kubernetes::KIND,
    #[cfg(feature = "s3")]
    &super::s3::KIND,
    #[cfg(feature = "dynamodb")]
    &super::dynamodb::KIND,
    #[cfg(feature = "gcs")]
    &super::gcs::KIND,
    #[cfg(feature = "datastore")]
    &super::datastore::KIND,
    #[cfg(feature = "azblob")]
    &super::azblob::KIND,
];

/// Every store any build may have, by name (its Cargo feature): a scheme this build does not
/// know is then told apart from a store left out of this build.
pub const EVERY_STORE: &[&str] = &[
    "sqlite",
    "postgres",
    "mysql",
    "redis",
    "etcd",
    "nats",
    "zookeeper",
    "kubernetes",
    "s3",
    "dynamodb",
    "gcs",
    "datastore",
    "azblob",
];

/// The store of this build that `scheme` names (any case).
pub fn by_scheme(scheme: &str) -> Option<&'static StoreKind> {
    STORES.iter().copied().find(|kind| kind.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// The store of this build named `name` (its Cargo feature).
pub fn by_name(name: &str) -> Option<&'static StoreKind> {
    STORES.iter().copied().find(|kind| kind.name == name)
}

/// Every scheme this build knows, in the list's order.
pub fn schemes() -> impl Iterator<Item = &'static str> {
    STORES.iter().flat_map(|kind| kind.schemes.iter().copied())
}

/// Parse `--store`. `None` picks the embedded default file in `state_dir`.
pub fn parse(
    url: Option<&str>,
    state_dir: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<Box<dyn StoreSpec>, String> {
    match url {
        Some(url) => parse_url(url),
        None => default_store(state_dir),
    }
}

/// Parse a store URL: the scheme picks the store, whose parser checks the rest. The error
/// names the flag and the URL, without its password.
pub fn parse_url(url: &str) -> Result<Box<dyn StoreSpec>, String> {
    let shown = redact(url);
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(format!("--store {shown:?} is not a URL (expected e.g. sqlite:///path/to/file.db)"));
    };
    let Some(kind) = by_scheme(scheme) else {
        let scheme = scheme.to_ascii_lowercase();
        let known = schemes().collect::<Vec<_>>().join(", ");
        let left_out: Vec<&str> = EVERY_STORE.iter().copied().filter(|name| by_name(name).is_none()).collect();
        return Err(match left_out.as_slice() {
            [] => format!("--store: unknown scheme {scheme:?} (this build knows: {known})"),
            _ => format!(
                "--store: unknown scheme {scheme:?} (this build knows: {known}; it was built without the {} \
                 store{})",
                left_out.join(", "),
                if left_out.len() == 1 { "" } else { "s" }
            ),
        });
    };
    // Before anything connects, whichever store it is.
    #[cfg(feature = "tls")]
    super::tls::choose_crypto_provider();
    (kind.parse)(url).map_err(|why| format!("--store {shown:?}: {why}"))
}

#[cfg(feature = "sqlite")]
fn default_store(state_dir: impl FnOnce() -> Result<PathBuf, String>) -> Result<Box<dyn StoreSpec>, String> {
    Ok(Box::new(super::sqlite::default_file(state_dir()?)))
}

#[cfg(not(feature = "sqlite"))]
fn default_store(_: impl FnOnce() -> Result<PathBuf, String>) -> Result<Box<dyn StoreSpec>, String> {
    Err("--store: this build of leaderrun has no embedded store (its sqlite feature is off): give --store URL".into())
}

/// The state directory of the embedded default store.
#[cfg(feature = "sqlite")]
pub use super::sqlite::default_state_dir;

#[cfg(not(feature = "sqlite"))]
pub fn default_state_dir() -> Result<PathBuf, String> {
    Err("no embedded store in this build".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_of_this_build_is_named_once_and_by_its_feature() {
        for kind in STORES {
            assert!(EVERY_STORE.contains(&kind.name), "{} is missing from EVERY_STORE", kind.name);
            assert_eq!(STORES.iter().filter(|k| k.name == kind.name).count(), 1, "{}", kind.name);
            for scheme in kind.schemes {
                assert_eq!(by_scheme(scheme).map(|k| k.name), Some(kind.name), "{scheme} is claimed twice");
                assert_eq!(*scheme, scheme.to_ascii_lowercase());
            }
            assert!(kind.usage.starts_with(&format!("{}://", kind.schemes[0])), "{}", kind.usage);
            assert!(kind.url.starts_with(&format!("{}://", kind.schemes[0])), "{}", kind.url);
            assert!(!kind.help.is_empty());
        }
    }

    #[test]
    fn the_default_is_the_embedded_file() {
        let spec = parse(None, || Ok(PathBuf::from("/state"))).unwrap();
        assert_eq!(spec.shown(), "sqlite:///state/leaderrun.db");
        assert!(parse(None, || Err("no state directory".into())).unwrap_err().contains("no state directory"));
    }

    #[test]
    fn unknown_scheme_names_it_without_the_password() {
        let err = parse_url("zookeepr://u:hunter2@h/x").unwrap_err();
        assert!(err.contains("\"zookeepr\"") && err.contains("this build knows: sqlite"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = parse_url("not a url").unwrap_err();
        assert!(err.contains("not a URL"), "{err}");
        let err = parse_url("SQLITE:///a/b?x=1").unwrap_err();
        assert!(err.starts_with("--store \"SQLITE:///a/b?x=1\": unknown parameter ?x="), "{err}");
    }
}
