//! ZooKeeper's errors as the store reports them: one line, transient or refused.

use zookeeper_client::Error as ZkError;

use super::sessions::REQUEST_TIMEOUT;
use super::ZooKeeperStore;
use crate::store::StoreError;

/// Whether an error may pass on retry: no server reachable, connection lost, timed out,
/// throttled, session lost (a new one is opened). Missing permissions and bad requests will not.
fn transient(err: &ZkError) -> bool {
    !matches!(
        err,
        ZkError::NoAuth
            | ZkError::AuthFailed
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::Unimplemented
            | ZkError::QuotaExceeded
            | ZkError::MarshallingError
            | ZkError::NoChildrenForEphemerals
            | ZkError::UnmarshalError { .. }
    )
}

/// One line describing a ZooKeeper error.
fn describe(err: &ZkError) -> String {
    let text = match err {
        ZkError::NoAuth => {
            "not authorized (a wrong password, or nodes another user created: ZooKeeper ACLs)".to_string()
        }
        ZkError::NoHosts => "cannot reach any server: connection refused, no answer".to_string(),
        ZkError::Timeout => format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
        ZkError::ConnectionLoss => "not connected to a server (reconnecting)".to_string(),
        ZkError::SessionExpired => "the session expired".to_string(),
        ZkError::NoNode => "a node is missing (deleted by hand?)".to_string(),
        other => other.to_string(),
    };
    text.replace(['\n', '\r'], " ")
}

impl ZooKeeperStore {
    pub(super) fn error(&self, op: &str, err: &ZkError) -> StoreError {
        let mut message = format!("zookeeper store {}: {op}: {}", self.shown, describe(err));
        if self.tls.is_some() && matches!(err, ZkError::NoHosts) {
            // The client library does not say why a TLS connection failed.
            message.push_str(" or a failed TLS handshake (check cacert=, cert= and key=; -vvv shows more)");
        }
        if transient(err) {
            StoreError::unavailable(message)
        } else {
            StoreError::refused(message)
        }
    }
}
