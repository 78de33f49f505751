//! The one error type of the crate.
//!
//! Callers make decisions on the variant, not on text: the reconciler treats [`RuntimeError::Unavailable`]
//! as "retry later, keep the desired state", [`RuntimeError::NotFound`] as "the container is gone",
//! [`RuntimeError::Conflict`] as "someone else already created it", and [`RuntimeError::Pull`] as a
//! user-facing pod/endpoint error (bad image name, bad credentials). Everything the engine says in its
//! `{"message": ...}` body is kept verbatim in the variant, because that text is what an operator needs.

/// What went wrong talking to the container engine.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No engine could be reached: the socket is missing, the connection was refused or reset, or the
    /// engine did not answer within the request timeout. The text names the endpoint.
    #[error("{0}")]
    Unavailable(String),
    /// The engine answered 404: no such container or image.
    #[error("not found: {0}")]
    NotFound(String),
    /// The engine answered 409, typically a container name that is already taken.
    #[error("conflict: {0}")]
    Conflict(String),
    /// An image pull failed, either up front (HTTP error) or in the middle of the progress stream.
    #[error("image pull failed: {0}")]
    Pull(String),
    /// Any other error status from the engine, with its message.
    #[error("container engine error {status}: {message}")]
    Engine {
        /// The HTTP status code.
        status: u16,
        /// The engine's `message`, or the raw body when it was not the usual JSON.
        message: String,
    },
    /// The engine answered something this client cannot make sense of (bad JSON, a broken log frame,
    /// an API version it cannot parse).
    #[error("unexpected answer from the container engine: {0}")]
    Protocol(String),
}

impl RuntimeError {
    /// Turns an error status and its body into the matching variant.
    ///
    /// The Engine API's error bodies are `{"message": "..."}`; anything else (a proxy's HTML page, an
    /// empty body) is passed through as text so that it still reaches the log.
    pub(crate) fn from_status(status: u16, body: &[u8]) -> RuntimeError {
        let message = engine_message(body).unwrap_or_else(|| format!("HTTP {status}"));
        match status {
            404 => RuntimeError::NotFound(message),
            409 => RuntimeError::Conflict(message),
            _ => RuntimeError::Engine { status, message },
        }
    }

    /// Whether retrying later may help: the engine was not reachable, or it failed internally.
    pub fn is_transient(&self) -> bool {
        match self {
            RuntimeError::Unavailable(_) => true,
            RuntimeError::Engine { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// The `message` of an engine error body, else the body as trimmed text; `None` when empty.
pub(crate) fn engine_message(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        message: String,
    }
    if let Ok(ErrorBody { message }) = serde_json::from_slice::<ErrorBody>(body) {
        return Some(message);
    }
    let text = String::from_utf8_lossy(body).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_maps_to_variant_and_keeps_the_engine_message() {
        let body = br#"{"message":"No such container: x"}"#;
        assert!(
            matches!(RuntimeError::from_status(404, body), RuntimeError::NotFound(m) if m == "No such container: x")
        );
        assert!(
            matches!(RuntimeError::from_status(409, b"{\"message\":\"in use\"}"), RuntimeError::Conflict(m) if m == "in use")
        );
        match RuntimeError::from_status(500, b"plain text\n") {
            RuntimeError::Engine { status, message } => assert_eq!((status, message.as_str()), (500, "plain text")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            matches!(RuntimeError::from_status(502, b""), RuntimeError::Engine { message, .. } if message == "HTTP 502")
        );
    }
}
