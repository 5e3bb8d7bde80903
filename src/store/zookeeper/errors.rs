//! ZooKeeper's errors as the store reports them: one line, transient or refused.

use zookeeper_client::Error as ZkError;

use super::timeouts::REQUEST_TIMEOUT;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// While the ensemble elects a leader, or a session moves to another server, requests fail
    /// with these: each passes once a leader serves (a one-shot run retries, a holder renews).
    #[test]
    fn what_an_election_or_a_move_answers_is_transient() {
        let election = [
            ZkError::ConnectionLoss,
            ZkError::SessionMoved,
            ZkError::NotReadOnly,
            ZkError::NoHosts,
            ZkError::Timeout,
            ZkError::Throttled,
            ZkError::SessionExpired,
            ZkError::UnexpectedError("no response from connection in 2075ms".into()),
        ];
        for err in election {
            assert!(transient(&err), "{err:?}");
        }
        for err in [ZkError::NoAuth, ZkError::AuthFailed, ZkError::InvalidAcl] {
            assert!(!transient(&err), "{err:?}");
        }
    }
}
