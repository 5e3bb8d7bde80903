//! The Datastore v1 REST calls (`:lookup`, `:commit`, `:runQuery`, `:rollback`) and what
//! their answers mean for leaderrun: a result, an answer the caller interprets (a lost
//! race: 409, 404, a 400 for an expired transaction), an outage (try again) or a refusal
//! (exit 69), each in one line naming the URL, the call and the entity.
//!
//! Messages are built from the URL, the HTTP status and Google's error status and message;
//! never from a request, so never with a token in them.

use serde_json::Value;

use super::entity::Place;
use crate::store::google::{describe_send_error, GoogleApi};
use crate::store::{Result, StoreError};

/// A refused call the caller may take for a lost race.
#[derive(Debug)]
pub struct Failure {
    pub status: u16,
    /// Google's status name (`ALREADY_EXISTS`, `ABORTED`, `NOT_FOUND`, `INVALID_ARGUMENT`).
    pub code: String,
    pub message: String,
    /// `URL: method what: HTTP status CODE: message`, for an error.
    described: String,
}

impl Failure {
    /// As a store error: an answer the caller did not expect. ABORTED (contention) is worth
    /// another try; anything else is not.
    pub fn into_error(self) -> StoreError {
        if self.code == "ABORTED" {
            StoreError::unavailable(self.described)
        } else {
            StoreError::refused(self.described)
        }
    }
}

/// What a call brought back.
pub enum Answer {
    Ok(Value),
    Failed(Failure),
}

/// One database's API, with the place its locks live.
pub struct Api {
    google: GoogleApi,
    pub place: Place,
    /// The URL, for messages.
    pub shown: String,
}

impl Api {
    pub fn new(google: GoogleApi, place: Place, shown: String) -> Self {
        Self { google, place, shown }
    }

    /// POST `body` to `projects/PROJECT:method`; `what` names the entity for messages.
    /// Statuses that end the matter (401, 403, 429, 5xx, a Native-mode database, a server
    /// that is not a Datastore API) become errors here; the others go back to the caller.
    pub async fn call(&self, method: &str, what: &str, mut body: Value) -> Result<Answer> {
        if !self.place.database.is_empty() {
            body["databaseId"] = Value::String(self.place.database.clone());
        }
        tracing::trace!(op = method, "store request");
        let url = format!("{}/v1/projects/{}:{method}", self.google.base(), self.place.project);
        let at = format!("{}: {method} {what}", self.shown);
        let request = self
            .google
            .request(reqwest::Method::POST, &url)
            .await
            .map_err(|e| StoreError { message: format!("{}: {}", self.shown, e.message), ..e })?;
        let response = request
            .json(&body)
            .send()
            .await
            .map_err(|e| StoreError::unavailable(format!("{at}: {}", describe_send_error(e))))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|e| StoreError::unavailable(format!("{at}: reading the answer: {}", describe_send_error(e))))?;
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if status == 200 {
            return json.map(Answer::Ok).ok_or_else(|| StoreError::refused(format!("{at}: the answer is not JSON")));
        }
        let Some(error) = json.as_ref().map(|j| &j["error"]).filter(|e| e.is_object()) else {
            // Not Google's error format: a proxy's page, or no Datastore API at this address.
            let what = if status == 404 { " (no Datastore API answers here)" } else { "" };
            let failure = format!("{at}: HTTP {status}{what}");
            return Err(if is_retryable(status) {
                StoreError::unavailable(failure)
            } else {
                StoreError::refused(failure)
            });
        };
        let code = error["status"].as_str().unwrap_or_default().to_string();
        let message = one_line(error["message"].as_str().unwrap_or_default());
        let described = format!("{at}: HTTP {status} {code}: {message}");
        if message.to_ascii_lowercase().contains("native mode") {
            return Err(StoreError::refused(format!(
                "{}: this database is Firestore in Native mode, which does not serve the Datastore API: \
                 leaderrun needs a database in Datastore mode ({method}: HTTP {status} {code})",
                self.shown
            )));
        }
        match status {
            401 => Err(StoreError::refused(format!("{described} (the credentials were not accepted)"))),
            403 => Err(StoreError::refused(described)),
            s if is_retryable(s) => Err(StoreError::unavailable(described)),
            _ => Ok(Answer::Failed(Failure { status, code, message, described })),
        }
    }

    /// `call`, where any failure is an error.
    pub async fn call_ok(&self, method: &str, what: &str, body: Value) -> Result<Value> {
        match self.call(method, what, body).await? {
            Answer::Ok(value) => Ok(value),
            Answer::Failed(failure) => Err(failure.into_error()),
        }
    }

    /// Roll a transaction back, best effort: it holds locks on a server with pessimistic
    /// transactions until it ends or times out. A failure changes nothing for the caller.
    pub async fn rollback(&self, what: &str, transaction: &Value) {
        if let Err(err) = self.call("rollback", what, serde_json::json!({"transaction": transaction})).await {
            tracing::debug!("{}", err.message);
        }
    }
}

/// 408, 429 and 5xx: the server is busy or unwell; 501 (not implemented) is not.
fn is_retryable(status: u16) -> bool {
    matches!(status, 408 | 429) || (500..=599).contains(&status) && status != 501
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
