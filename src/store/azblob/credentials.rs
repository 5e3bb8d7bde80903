//! Where the account's blob endpoint is and how requests are authorized, found as the Azure
//! CLI finds them, in its order:
//!
//! 1. `AZURE_STORAGE_CONNECTION_STRING`: `AccountName`, `AccountKey` or
//!    `SharedAccessSignature`, and the endpoint: `BlobEndpoint` if given (Azurite's
//!    `http://127.0.0.1:10000/devstoreaccount1`), else `DefaultEndpointsProtocol` (https) and
//!    `EndpointSuffix` (core.windows.net). `UseDevelopmentStorage=true` is Azurite on its
//!    default port with its well-known account.
//! 2. `AZURE_STORAGE_KEY`: the account key (Shared Key signing), at
//!    `https://ACCOUNT.blob.core.windows.net`.
//! 3. `AZURE_STORAGE_SAS_TOKEN`: a SAS token, sent as the query of every request.
//!
//! Microsoft Entra ID (managed identities, `az login`) is not supported. The key and the SAS
//! are kept here and in the request signer only: no message shows them (a SAS travels in
//! URLs, and leaderrun never prints a URL it sent).

use super::target::Target;

/// How requests are authorized.
#[derive(Clone)]
pub enum Auth {
    /// Shared Key: the account key, decoded from base64.
    Key(Vec<u8>),
    /// A SAS token: the query to add to every request, without a leading `?`.
    Sas(String),
}

/// The account's blob endpoint and its authorization. Deliberately without Debug.
#[derive(Clone)]
pub struct Account {
    pub name: String,
    /// `https://ACCOUNT.blob.core.windows.net`, or a `BlobEndpoint`; no trailing `/`.
    pub endpoint: String,
    pub auth: Auth,
    /// Which variable it came from, for messages.
    pub source: &'static str,
}

/// Azurite's well-known development account and key (published in its README).
pub const DEVELOPMENT_ACCOUNT: &str = "devstoreaccount1";
const DEVELOPMENT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

const CONNECTION_STRING: &str = "AZURE_STORAGE_CONNECTION_STRING";
const KEY: &str = "AZURE_STORAGE_KEY";
const SAS: &str = "AZURE_STORAGE_SAS_TOKEN";

/// The account of `target` from the environment, or why there is none (a refusal: a
/// setting to fix, never worth a retry). Never shows a secret.
pub fn from_env(target: &Target) -> Result<Account, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(text) = var(CONNECTION_STRING) {
        return connection_string(&text, &target.account);
    }
    let endpoint = format!("https://{}.blob.core.windows.net", target.account);
    let name = target.account.clone();
    if let Some(key) = var(KEY) {
        let auth = Auth::Key(decode_key(&key).map_err(|why| format!("{KEY} {why}"))?);
        return Ok(Account { name, endpoint, auth, source: KEY });
    }
    if let Some(sas) = var(SAS) {
        return Ok(Account { name, endpoint, auth: Auth::Sas(sas.trim().trim_start_matches('?').into()), source: SAS });
    }
    Err(format!("no credentials: set {CONNECTION_STRING}, {KEY} or {SAS}, as for the Azure CLI"))
}

fn decode_key(key: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(key.trim())
        .map_err(|_| "is not an account key (base64)".to_string())
        .and_then(|bytes| if bytes.is_empty() { Err("is empty".into()) } else { Ok(bytes) })
}

/// An Azure Storage connection string, for `account` (the URL's): a string for another
/// account is refused rather than used against the URL's wishes.
pub fn connection_string(text: &str, account: &str) -> Result<Account, String> {
    let mut fields = std::collections::HashMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        // A value may itself hold '=' (a base64 key, a SAS): split at the first only.
        let Some((name, value)) = part.split_once('=') else {
            return Err(format!("{CONNECTION_STRING} is not a connection string (a part has no '=')"));
        };
        fields.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let get = |name: &str| fields.get(name).cloned();
    if get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        fields.entry("accountname".into()).or_insert_with(|| DEVELOPMENT_ACCOUNT.into());
        fields.entry("accountkey".into()).or_insert_with(|| DEVELOPMENT_KEY.into());
        fields.entry("blobendpoint".into()).or_insert_with(|| format!("http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT}"));
    }
    let get = |name: &str| fields.get(name).cloned();
    let name = get("accountname").unwrap_or_else(|| account.to_string());
    if name != account {
        return Err(format!("{CONNECTION_STRING} is for the account {name:?}, but the store URL names {account:?}"));
    }
    let endpoint = match get("blobendpoint") {
        Some(endpoint) => endpoint.trim_end_matches('/').to_string(),
        None => {
            let protocol = get("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
            let suffix = get("endpointsuffix").unwrap_or_else(|| "core.windows.net".into());
            format!("{protocol}://{name}.blob.{suffix}")
        }
    };
    if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
        return Err(format!("{CONNECTION_STRING}: BlobEndpoint is not an http(s) URL"));
    }
    let auth = match (get("accountkey"), get("sharedaccesssignature")) {
        (Some(key), _) => Auth::Key(decode_key(&key).map_err(|why| format!("{CONNECTION_STRING}: AccountKey {why}"))?),
        (None, Some(sas)) => Auth::Sas(sas.trim_start_matches('?').to_string()),
        (None, None) => {
            return Err(format!("{CONNECTION_STRING} has neither AccountKey nor SharedAccessSignature"));
        }
    };
    Ok(Account { name, endpoint, auth, source: CONNECTION_STRING })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings() {
        let azurite = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEVELOPMENT_KEY};\
             BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
        );
        let account = connection_string(&azurite, DEVELOPMENT_ACCOUNT).unwrap();
        assert_eq!(account.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        assert!(matches!(account.auth, Auth::Key(ref k) if k.len() == 64));
        let dev = connection_string("UseDevelopmentStorage=true", DEVELOPMENT_ACCOUNT).unwrap();
        assert_eq!(dev.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        let sas = connection_string("AccountName=acct1;SharedAccessSignature=sv=2022&sig=abc%3D", "acct1").unwrap();
        assert_eq!(sas.endpoint, "https://acct1.blob.core.windows.net");
        assert!(matches!(sas.auth, Auth::Sas(ref q) if q == "sv=2022&sig=abc%3D"));
        let suffix =
            connection_string("AccountName=acct1;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn", "acct1");
        assert_eq!(suffix.unwrap().endpoint, "https://acct1.blob.core.chinacloudapi.cn");
    }

    #[test]
    fn bad_connection_strings_are_refused_without_the_key() {
        let err = |text: &str| connection_string(text, "acct1").err().unwrap();
        assert!(err("AccountName=other;AccountKey=a2V5").contains("for the account \"other\""));
        assert!(err("AccountName=acct1").contains("neither AccountKey nor SharedAccessSignature"));
        let bad = err("AccountName=acct1;AccountKey=not base64 SeCrEt!");
        assert!(bad.contains("not an account key") && !bad.contains("SeCrEt"), "{bad}");
        assert!(err("garbage").contains("not a connection string"));
    }
}
