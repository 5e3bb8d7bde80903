//! The S3 server's clock: each response's `Date` header, caught by an interceptor on the
//! AWS SDK's request. The token floor and the create's settling that rest on it are shared
//! with Cloud Storage (`client_timed/server_clock.rs`).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;

use crate::store::client_timed::server_clock::parse_http_date;

/// Records the `Date` header of one request's response (whatever its status), for the
/// request it is attached to with `.customize().interceptor(..)`.
#[derive(Debug, Clone, Default)]
pub struct DateHeader(Arc<Mutex<Option<SystemTime>>>);

impl DateHeader {
    /// The server's clock when it answered, if it said.
    pub fn get(&self) -> Option<SystemTime> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Intercept for DateHeader {
    fn name(&self) -> &'static str {
        "leaderrun-server-date"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let date = context.response().headers().get("date").and_then(parse_http_date);
        if date.is_some() {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = date;
        }
        Ok(())
    }
}
