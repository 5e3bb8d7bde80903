//! Finding the cluster and the credentials as kubectl does: the kubeconfig ($KUBECONFIG,
//! several files merged, else ~/.kube/config) with its current context (or `?context=`),
//! client certificates, bearer tokens and exec credential plugins; else, in a pod, the
//! service account (KUBERNETES_SERVICE_HOST/_PORT, its mounted token, re-read when it
//! rotates, and its CA). kube-rs does the reading; this file picks which and words the errors.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Config;

use super::target::Target;
use crate::store::{Result, StoreError};

/// Time to open a connection (and TLS session) to the API server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client, the namespace to use and the server's URL (for messages).
pub(super) async fn connect(target: &Target) -> Result<(kube::Client, String, String)> {
    // kube's rustls needs the process's provider chosen (ring): the registry does it when it
    // parses a URL, and this does it for callers that build a Target without it (tests, embedders).
    crate::store::tls::choose_crypto_provider();
    let mut config = config(target).await?;
    // leaderrun retries on its own schedule: a retry hidden in the client would spend the
    // lease's time, and a write retried after a lost answer could apply twice.
    config.default_retry = false;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    let namespace = target.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| StoreError::refused(format!("{}: cannot set up the client: {e}", target.shown)))?;
    Ok((client, namespace, server))
}

async fn config(target: &Target) -> Result<Config> {
    let refused = |why: String| StoreError::refused(format!("{}: {why}", target.shown));
    if !has_kubeconfig() && target.context.is_none() && target.kubeconfig.is_none() {
        return Config::incluster().map_err(|e| {
            refused(format!(
                "no kubeconfig ($KUBECONFIG is not set and ~/.kube/config does not exist), and not in a pod \
                 ({e})"
            ))
        });
    }
    let options = KubeConfigOptions { context: target.context.clone(), ..Default::default() };
    let kubeconfig = match &target.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    let kubeconfig = kubeconfig.map_err(|e| refused(format!("the kubeconfig: {}", shown_error(&e))))?;
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| refused(format!("the kubeconfig: {}", shown_error(&e))))
}

/// Whether kubectl would read a kubeconfig: $KUBECONFIG is set, or ~/.kube/config exists.
fn has_kubeconfig() -> bool {
    let set = std::env::var_os("KUBECONFIG").is_some_and(|paths| !paths.is_empty());
    let home = std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".kube/config"));
    set || home.is_some_and(|path| path.exists())
}

/// A kubeconfig error, without the YAML parser's quote of the file (it may hold a token).
fn shown_error(error: &kube::config::KubeconfigError) -> String {
    let text = error.to_string();
    const PARSE: &str = "failed to parse kubeconfig YAML";
    if text.starts_with(PARSE) {
        return format!("{PARSE} (run kubectl config view to see where)");
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
