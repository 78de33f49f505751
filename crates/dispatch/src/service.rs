//! The `WorkerGateway.Connect` handler.

use std::sync::Arc;

use gantry_proto::auth;
use gantry_proto::v1::worker_gateway_server::WorkerGateway;
use gantry_proto::v1::{Hello, HelloAck, SchedulerMessage, WorkerMessage, scheduler_message, worker_message::Kind};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::files::Assembly;
use crate::registry::Inner;
use crate::status::StreamError;

/// The gRPC service; get one from
/// [`Dispatcher::service`](crate::Dispatcher::service).
pub struct GatewayService {
    inner: Arc<Inner>,
}

impl GatewayService {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }
}

#[tonic::async_trait]
impl WorkerGateway for GatewayService {
    type ConnectStream = UnboundedReceiverStream<Result<SchedulerMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        accept(&self.inner, request).await.map_err(|error| {
            tracing::warn!(%error, "worker stream refused");
            Status::from(error)
        })
    }
}

/// Authenticates, reads the Hello, answers with a HelloAck and hands the
/// stream to a reader task.
async fn accept(
    inner: &Arc<Inner>,
    request: Request<Streaming<WorkerMessage>>,
) -> Result<Response<UnboundedReceiverStream<Result<SchedulerMessage, Status>>>, StreamError> {
    let claims = auth::verify_metadata(request.metadata(), &inner.config.secret)?;
    let mut inbound = request.into_inner();

    let timeout = inner.config.hello_timeout;
    let first = tokio::time::timeout(timeout, inbound.message())
        .await
        .map_err(|_| StreamError::HelloTimeout(timeout))?
        .map_err(StreamError::Transport)?;
    let hello = match first.and_then(|message| message.kind) {
        Some(Kind::Hello(hello)) => hello,
        _ => return Err(StreamError::BadHello("the first message must be a hello")),
    };
    check_hello(&hello, &claims)?;

    let (tx, rx) = mpsc::unbounded_channel();
    let ack = HelloAck {
        scheduler_id: inner.config.scheduler_id.clone(),
        heartbeat_interval_ms: u64::try_from(inner.config.heartbeat_interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
    };
    let _ = tx.send(Ok(SchedulerMessage {
        kind: Some(scheduler_message::Kind::HelloAck(ack)),
    }));

    let inner = Arc::clone(inner);
    tokio::spawn(async move {
        let worker_id = hello.worker_id.clone();
        let registration = inner.register(hello, tx).await;
        let conn = registration.conn;
        let kill = registration.kill;
        let mut files = Assembly::new(inner.config.files.clone());
        let ended = loop {
            tokio::select! {
                () = kill.cancelled() => break None,
                message = inbound.message() => match message {
                    Ok(Some(message)) => deliver(&inner, &worker_id, conn, message, &mut files).await,
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                },
            }
        };
        files.close().await;
        if let Some(status) = ended {
            tracing::info!(%worker_id, %status, "worker stream failed");
        }
        inner.deregister(&worker_id, conn, None).await;
    });
    Ok(Response::new(UnboundedReceiverStream::new(rx)))
}

/// Routes one message: file chunks to the stream's [`Assembly`], everything
/// else to the registry, with the stored files of a result.
async fn deliver(inner: &Inner, worker_id: &str, conn: u64, message: WorkerMessage, files: &mut Assembly) {
    let stored = match &message.kind {
        Some(Kind::FileChunk(_)) => {
            if let Some(Kind::FileChunk(chunk)) = message.kind
                && inner.runs_on(worker_id, conn, &chunk.job_id, chunk.attempt)
            {
                files.chunk(chunk).await;
            }
            return;
        }
        Some(Kind::Result(result)) => files.result(&result.job_id, result.attempt, &result.files).await,
        Some(Kind::Failure(failure)) => {
            files.ended(&failure.job_id, failure.attempt).await;
            Ok(Vec::new())
        }
        Some(Kind::Cancelled(cancelled)) => {
            files.ended(&cancelled.job_id, cancelled.attempt).await;
            Ok(Vec::new())
        }
        _ => Ok(Vec::new()),
    };
    let unused = inner.on_message(worker_id, conn, message, stored).await;
    files.discard(unused).await;
}

fn check_hello(hello: &Hello, claims: &auth::WorkerClaims) -> Result<(), StreamError> {
    if hello.worker_id.is_empty() {
        return Err(StreamError::BadHello("worker_id is empty"));
    }
    // Stored with each job it runs, as text in every database.
    if hello.worker_id.len() > 128 || hello.worker_id.chars().any(char::is_control) {
        return Err(StreamError::BadHello(
            "worker_id must be at most 128 bytes, without control characters",
        ));
    }
    if hello.models.is_empty() {
        return Err(StreamError::BadHello("models is empty"));
    }
    if hello.models.iter().any(String::is_empty) {
        return Err(StreamError::BadHello("a model id is empty"));
    }
    if hello.slots == 0 {
        return Err(StreamError::BadHello("slots must be at least 1"));
    }
    if hello.worker_id != claims.sub {
        return Err(StreamError::WrongWorker {
            token: claims.sub.clone(),
            hello: hello.worker_id.clone(),
        });
    }
    if let Some(model) = hello.models.iter().find(|m| !claims.models.contains(m)) {
        return Err(StreamError::ModelNotAllowed(model.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker id is stored with every job it runs, as text in every
    /// database: one with a control character (a NUL, which PostgreSQL's
    /// text cannot hold) or over 128 bytes is refused at hello.
    #[test]
    fn worker_ids_must_be_storable() {
        let check = |worker_id: &str| {
            let hello = Hello {
                worker_id: worker_id.to_owned(),
                models: vec!["m".into()],
                slots: 1,
                ..Hello::default()
            };
            let claims = auth::WorkerClaims {
                sub: worker_id.to_owned(),
                models: vec!["m".into()],
                exp: u64::MAX,
                iat: 0,
            };
            check_hello(&hello, &claims)
        };
        assert!(check("w-1").is_ok());
        assert!(check(&"w".repeat(128)).is_ok());
        for bad in ["w\u{0}", "w\n1", &"w".repeat(129)] {
            assert!(
                matches!(check(bad), Err(StreamError::BadHello(message)) if message.contains("worker_id")),
                "{bad:?}"
            );
        }
    }
}
