//! Every reason the scheduler ends or refuses a worker stream, and the gRPC
//! status the worker sees for it. This is the only place that builds a
//! `tonic::Status` for workers.

use std::time::Duration;

use gantry_proto::auth::AuthError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// No, malformed, badly signed or expired token.
    #[error("{0}")]
    Unauthenticated(#[from] AuthError),
    /// The Hello names a worker other than the token's subject.
    #[error("token is for worker {token:?}, hello says {hello:?}")]
    WrongWorker { token: String, hello: String },
    /// The Hello offers a model the token does not cover.
    #[error("token does not allow serving model {0:?}")]
    ModelNotAllowed(String),
    /// The first message was not a Hello, or the Hello is unusable.
    #[error("bad hello: {0}")]
    BadHello(&'static str),
    /// The worker sent nothing within the hello timeout.
    #[error("no hello within {0:?}")]
    HelloTimeout(Duration),
    /// The stream broke before the Hello arrived.
    #[error("stream failed before hello: {0}")]
    Transport(Status),
    /// The worker missed its heartbeats for a whole lease.
    #[error("no message for {0:?} (heartbeat lease expired)")]
    LeaseExpired(Duration),
    /// A newer stream of the same worker id took over.
    #[error("replaced by a newer connection of the same worker")]
    Replaced,
    /// The scheduler is shutting down.
    #[error("scheduler is shutting down")]
    ShuttingDown,
}

impl From<StreamError> for Status {
    fn from(error: StreamError) -> Self {
        let message = error.to_string();
        match error {
            StreamError::Unauthenticated(_) => Status::unauthenticated(message),
            StreamError::WrongWorker { .. } | StreamError::ModelNotAllowed(_) => Status::permission_denied(message),
            StreamError::BadHello(_) => Status::invalid_argument(message),
            StreamError::HelloTimeout(_) => Status::deadline_exceeded(message),
            StreamError::Transport(status) => status,
            StreamError::LeaseExpired(_) | StreamError::ShuttingDown => Status::unavailable(message),
            StreamError::Replaced => Status::aborted(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn codes() {
        let cases = [
            (StreamError::Unauthenticated(AuthError::Missing), Code::Unauthenticated),
            (
                StreamError::WrongWorker {
                    token: "a".into(),
                    hello: "b".into(),
                },
                Code::PermissionDenied,
            ),
            (StreamError::ModelNotAllowed("m".into()), Code::PermissionDenied),
            (StreamError::BadHello("x"), Code::InvalidArgument),
            (
                StreamError::HelloTimeout(Duration::from_secs(1)),
                Code::DeadlineExceeded,
            ),
            (StreamError::LeaseExpired(Duration::from_secs(1)), Code::Unavailable),
            (StreamError::Replaced, Code::Aborted),
            (StreamError::ShuttingDown, Code::Unavailable),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }
}
