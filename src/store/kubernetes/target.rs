//! The `k8s://` URL, parsed once while the command line is checked.
//!
//! `k8s://[NAMESPACE][?context=NAME]` (or `kubernetes://`): the namespace holds the Leases;
//! without one, the kubeconfig context's namespace (or the pod's, in a cluster) is used, as
//! kubectl would. Where the cluster is and who we are come from the kubeconfig or the pod's
//! service account, never from the URL, so a URL never carries a credential.

use super::super::url::{percent_decode, redact};

/// The parts of a `k8s://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as given, for messages.
    pub shown: String,
    /// The Leases' namespace; `None`: the context's (or the pod's).
    pub(super) namespace: Option<String>,
    /// The kubeconfig context; `None`: its current context.
    pub(super) context: Option<String>,
    /// One kubeconfig file instead of $KUBECONFIG's (`with_kubeconfig`).
    pub(super) kubeconfig: Option<std::path::PathBuf>,
}

impl Target {
    /// Parse a `k8s://` or `kubernetes://` URL; the error is a bare reason, naming the part.
    pub fn parse(url: &str) -> Result<Self, String> {
        const EXPECTED: &str = "expected k8s://[NAMESPACE][?context=NAME]";
        let shown = redact(url);
        let (scheme, rest) = url.split_once("://").ok_or(EXPECTED)?;
        if !scheme.eq_ignore_ascii_case("k8s") && !scheme.eq_ignore_ascii_case("kubernetes") {
            return Err(format!("expected k8s:// or kubernetes:// ({EXPECTED})"));
        }
        let (namespace, query) = rest.split_once('?').unwrap_or((rest, ""));
        let namespace = percent_decode(namespace.trim_end_matches('/'));
        if namespace.contains(['/', '@', ':']) {
            // Not echoed: it may hold a password someone put there.
            return Err(format!(
                "names more than a namespace ({EXPECTED}: the cluster and the credentials come from \
                 the kubeconfig, or from the pod's service account)"
            ));
        }
        if !namespace.is_empty() {
            check_namespace(&namespace)?;
        }
        let mut context = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "context" if !value.is_empty() => context = Some(percent_decode(value)),
                "context" => return Err("?context= names no context".into()),
                _ => return Err(format!("unknown parameter ?{key}= (known: context)")),
            }
        }
        Ok(Target { shown, namespace: Some(namespace).filter(|n| !n.is_empty()), context, kubeconfig: None })
    }

    /// Read this kubeconfig file rather than $KUBECONFIG's, as `kubectl --kubeconfig` does:
    /// for a program that embeds leaderrun's stores, and for tests, which start one API
    /// server each in one process and so cannot share one environment variable.
    pub fn with_kubeconfig(self, path: impl Into<std::path::PathBuf>) -> Self {
        Self { kubeconfig: Some(path.into()), ..self }
    }
}

/// A namespace is a DNS-1123 label: at most 63 lower-case letters, digits and '-', starting
/// and ending with a letter or digit.
fn check_namespace(namespace: &str) -> Result<(), String> {
    let ok = namespace.len() <= 63
        && namespace.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{namespace:?} is not a namespace name (at most 63 lower-case letters, digits and '-', \
             starting and ending with a letter or digit)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        assert_eq!((t("k8s://").namespace, t("k8s://").context), (None, None));
        assert_eq!(t("k8s://team-a").namespace.as_deref(), Some("team-a"));
        assert_eq!(t("kubernetes://team-a/").namespace.as_deref(), Some("team-a"));
        assert_eq!(t("K8S://x").namespace.as_deref(), Some("x"));
        let both = t("k8s://ns?context=prod%2Feu");
        assert_eq!((both.namespace.as_deref(), both.context.as_deref()), (Some("ns"), Some("prod/eu")));
        assert_eq!(t("k8s://?context=dev").namespace, None);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("k8s://Team").contains("not a namespace name"));
        assert!(err(&format!("k8s://{}", "a".repeat(64))).contains("not a namespace name"));
        assert!(err("k8s://-a").contains("not a namespace name"));
        assert!(err("k8s://ns?ctx=a").contains("unknown parameter ?ctx= (known: context)"));
        assert!(err("k8s://ns?context=").contains("names no context"));
        assert!(err("k8s://ns/sub").contains("names more than a namespace"));
        let with_secret = err("k8s://u:hunter2@host/ns");
        assert!(with_secret.contains("kubeconfig") && !with_secret.contains("hunter2"), "{with_secret}");
        assert!(err("k8s:ns").contains("expected k8s://"));
    }
}
