//! Shared access signatures for Azurite's development account, made as Azure documents them
//! (version 2020-12-06 strings to sign, HMAC-SHA256):
//!
//! - an account SAS (`ss=b`, `srt=sco`), signed with the account key: it may call anything,
//!   the container's own operations included;
//! - a container SAS (a service SAS, `sr=c`), signed with the account key, as
//!   `az storage container generate-sas --account-key` makes one: the container's blobs only;
//! - a user delegation SAS (`sr=c`, `skoid`…`skv`), as `az storage container generate-sas
//!   --as-user --auth-mode login` makes one: signed with a user delegation key. The real
//!   service hands that key out to an Entra ID identity (Get User Delegation Key); Azurite
//!   hands it out only over OAuth on HTTPS, but derives its value from the key's fields and a
//!   constant published in its source (`USERDELEGATIONKEY_BASIC_KEY`), which is what
//!   `user_delegation_key` does. Only that step differs from the real service.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;

use super::azurite::ACCOUNT;

/// The version every SAS here is made for.
const VERSION: &str = "2020-12-06";
/// Azurite's root of user delegation keys (azurite 3.35, `src/blob/utils/constants.ts`).
const AZURITE_DELEGATION_ROOT: &str =
    "I17GKLvcJUossaebtsEDZZ2RJ8GNLwLH4m7hRMxbVbkx6wNIRAABj4Rtw0FBhFuEAgmbL4gFMzUw+AStz9Sqdg==";

/// HMAC-SHA256 of `text` under `key`, in base64.
fn hmac_with(key: &[u8], text: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, text.as_bytes()).as_ref())
}

/// HMAC-SHA256 of `text` under a base64 key, in base64.
fn hmac(key_base64: &str, text: &str) -> String {
    hmac_with(&base64::engine::general_purpose::STANDARD.decode(key_base64).expect("a base64 key"), text)
}

/// A query value, percent-encoded (what a SAS's values may hold).
fn encode(text: &str) -> String {
    text.replace('%', "%25").replace('+', "%2B").replace('/', "%2F").replace('=', "%3D").replace(':', "%3A")
}

/// An account SAS for the blob service, signed with `key`.
pub fn account_sas(permissions: &str, key: &str) -> String {
    let version = "2021-06-08";
    let expiry = format_iso(SystemTime::now() + Duration::from_secs(3600));
    let to_sign = format!("{ACCOUNT}\n{permissions}\nb\nsco\n\n{expiry}\n\nhttps,http\n{version}\n\n");
    let sig = hmac(key, &to_sign);
    format!("sv={version}&ss=b&srt=sco&sp={permissions}&se={}&spr=https,http&sig={}", encode(&expiry), encode(&sig))
}

/// A container SAS (`sr=c`) for `container`, signed with the account key `key`.
pub fn container_sas(container: &str, permissions: &str, key: &str) -> String {
    let expiry = format_iso(SystemTime::now() + Duration::from_secs(3600));
    let resource = format!("/blob/{ACCOUNT}/{container}");
    // sp, st, se, resource, si, sip, spr, sv, sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct
    let fields = [permissions, "", &expiry, &resource, "", "", "", VERSION, "c", "", "", "", "", "", "", ""];
    let sig = hmac(key, &fields.join("\n"));
    format!("sv={VERSION}&sr=c&sp={permissions}&se={}&sig={}", encode(&expiry), encode(&sig))
}

/// The fields of a user delegation key, as Get User Delegation Key returns them.
struct DelegationKey {
    oid: String,
    tid: String,
    start: String,
    expiry: String,
    value: String,
}

/// The user delegation key Azurite would hand out for these fields.
fn user_delegation_key() -> DelegationKey {
    let now = SystemTime::now();
    let oid = "6d0f0c3e-5e3a-4b8f-9a51-0c2a9b1e7f11".to_string();
    let tid = "72f988bf-86f1-41af-91ab-2d7cd011db47".to_string();
    let start = format_iso(now - Duration::from_secs(300));
    let expiry = format_iso(now + Duration::from_secs(3600));
    // Azurite keys its HMAC with the root's text itself, not the bytes it encodes.
    let value = hmac_with(AZURITE_DELEGATION_ROOT.as_bytes(), &[&oid, &tid, &start, &expiry, "b", VERSION].join("\n"));
    DelegationKey { oid, tid, start, expiry, value }
}

/// A user delegation SAS (`sr=c`) for `container`.
pub fn user_delegation_sas(container: &str, permissions: &str) -> String {
    let key = user_delegation_key();
    let expiry = format_iso(SystemTime::now() + Duration::from_secs(1800));
    let resource = format!("/blob/{ACCOUNT}/{container}");
    // sp, st, se, resource, skoid, sktid, skt, ske, sks, skv, saoid, suoid, scid, sip, spr, sv,
    // sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct
    let fields = [
        permissions,
        "",
        &expiry,
        &resource,
        &key.oid,
        &key.tid,
        &key.start,
        &key.expiry,
        "b",
        VERSION,
        "",
        "",
        "",
        "",
        "",
        VERSION,
        "c",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    ];
    let sig = hmac(&key.value, &fields.join("\n"));
    format!(
        "sv={VERSION}&sr=c&sp={permissions}&se={}&skoid={}&sktid={}&skt={}&ske={}&sks=b&skv={VERSION}&sig={}",
        encode(&expiry),
        key.oid,
        key.tid,
        encode(&key.start),
        encode(&key.expiry),
        encode(&sig)
    )
}

/// A connection string that reaches Azurite at `port` with `sas`.
pub fn sas_connection_string(port: u16, sas: &str) -> String {
    format!("BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};SharedAccessSignature={sas}")
}

/// `YYYY-MM-DDTHH:MM:SSZ`
pub fn format_iso(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}
