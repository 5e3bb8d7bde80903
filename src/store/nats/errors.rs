//! The clients' errors as the store reads them: one line, and whether a retry may pass.

/// Whether an error (by its text) may pass on retry. JetStream answers a bad request with
/// a 4xx code; a refused login or permission is not worth retrying either.
pub(super) fn transient(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let refused = ["authorization violation", "authentication", "permissions violation", "(code 400", "(code 403"];
    !refused.iter().any(|needle| lower.contains(needle))
}

/// One line: the error and its sources.
pub(super) fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(&format!(": {more}"));
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}
