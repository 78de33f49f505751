//! Following a job as it runs: its chunks in order as they are committed,
//! then its final view. Shared by `GET /v2/{model_id}/stream/{job_id}` with
//! `Accept: text/event-stream` and by the OpenAI-compatible streaming routes.
//!
//! A reader in the process whose scheduler runs the job is woken when chunks
//! are committed (no polling); a reader in another process reads again every
//! [`REREAD`] as well. Each reader keeps its own position, so any number of
//! readers (and a reconnecting one with `Last-Event-ID`) see every chunk.
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use gantry_scheduler::{JobError, JobStore, JobView};
use serde_json::Value;
use tokio::sync::mpsc;

/// How often a reader reads the job again without being woken (readers in
/// another process than the job's scheduler, and a safety net).
const REREAD: Duration = Duration::from_millis(250);
/// An SSE comment is sent after this long without data, so proxies keep the
/// connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Frames buffered per reader before the reader waits for the client.
const BUFFER: usize = 64;

/// What a reader sees, in order: chunks, then exactly one `Final` (or an error).
pub(crate) enum Frame {
    Chunk {
        seq: i64,
        output: Value,
    },
    /// The job's latest progress message, when it changed.
    Progress(Value),
    KeepAlive,
    Final(Box<JobView>),
    Failed(JobError),
}

/// Where a reader starts and whose job it reads.
pub(crate) struct Follow {
    pub jobs: JobStore,
    pub user: String,
    pub model: String,
    pub job_id: String,
    /// First chunk sequence number to deliver.
    pub from: i64,
    /// Cancel the job if the client goes away before it ends (a stream that
    /// owns its job, as an OpenAI streaming request does).
    pub cancel_on_disconnect: bool,
}

/// Starts a reader task; its frames arrive on the returned channel. The task
/// ends after the final frame, or as soon as the receiver is dropped.
pub(crate) fn follow(f: Follow) -> mpsc::Receiver<Frame> {
    let (tx, rx) = mpsc::channel(BUFFER);
    actix_web::rt::spawn(async move {
        let live = f.jobs.watch_stream(&f.job_id);
        let mut next = f.from;
        let mut quiet_since = tokio::time::Instant::now();
        let mut progress: Option<Value> = None;
        loop {
            // Subscribed before reading: a commit in between wakes the wait below.
            let notified = live.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match f.jobs.chunks_from(&f.user, &f.model, &f.job_id, next).await {
                Err(error) => {
                    let _ = tx.send(Frame::Failed(error)).await;
                    return;
                }
                Ok((view, chunks)) => {
                    for (seq, output) in chunks {
                        next = seq + 1;
                        if tx.send(Frame::Chunk { seq, output }).await.is_err() {
                            return disconnected(&f, view.status.is_final()).await;
                        }
                        quiet_since = tokio::time::Instant::now();
                    }
                    if view.status.is_final() {
                        let _ = tx.send(Frame::Final(Box::new(view))).await;
                        return;
                    }
                    if view.progress.is_some() && view.progress != progress {
                        progress.clone_from(&view.progress);
                        let message = view.progress.unwrap_or(Value::Null);
                        if tx.send(Frame::Progress(message)).await.is_err() {
                            return disconnected(&f, false).await;
                        }
                        quiet_since = tokio::time::Instant::now();
                    }
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(REREAD) => {
                    if quiet_since.elapsed() >= KEEP_ALIVE {
                        if tx.send(Frame::KeepAlive).await.is_err() {
                            return disconnected(&f, false).await;
                        }
                        quiet_since = tokio::time::Instant::now();
                    }
                }
                () = tx.closed() => return disconnected(&f, false).await,
            }
        }
    });
    rx
}

async fn disconnected(f: &Follow, is_final: bool) {
    if f.cancel_on_disconnect && !is_final {
        tracing::debug!(job_id = %f.job_id, "stream reader went away: cancelling its job");
        if let Err(error) = f.jobs.cancel(&f.user, &f.model, &f.job_id).await {
            tracing::warn!(job_id = %f.job_id, %error, "could not cancel the job of a closed stream");
        }
    }
}

/// A `text/event-stream` response whose body is `frames`, each turned into
/// SSE text by `render` (which may skip a frame by returning nothing).
pub(crate) fn sse_response(
    mut frames: mpsc::Receiver<Frame>,
    mut render: impl FnMut(Frame) -> Option<String> + 'static,
) -> HttpResponse {
    let body = async_stream(move |tx: mpsc::Sender<Result<Bytes, actix_web::Error>>| async move {
        while let Some(frame) = frames.recv().await {
            let last = matches!(frame, Frame::Final(_) | Frame::Failed(_));
            if let Some(text) = render(frame)
                && tx.send(Ok(Bytes::from(text))).await.is_err()
            {
                return;
            }
            if last {
                return;
            }
        }
    });
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body)
}

/// A body stream fed by a local task.
fn async_stream<F, Fut>(produce: F) -> impl futures_util::Stream<Item = Result<Bytes, actix_web::Error>>
where
    F: FnOnce(mpsc::Sender<Result<Bytes, actix_web::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let (tx, rx) = mpsc::channel(BUFFER);
    actix_web::rt::spawn(produce(tx));
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

/// One SSE event: optional id and event name, then the data line(s).
pub(crate) fn event(id: Option<i64>, name: Option<&str>, data: &str) -> String {
    let mut text = String::with_capacity(data.len() + 32);
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    if let Some(name) = name {
        text.push_str(&format!("event: {name}\n"));
    }
    for line in data.split('\n') {
        text.push_str("data: ");
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    text
}

/// Whether the client asked for Server-Sent Events.
pub(crate) fn wants_sse(req: &actix_web::HttpRequest) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(',')
                .any(|part| part.trim().starts_with("text/event-stream"))
        })
}

/// The position after `Last-Event-ID` (0 without one); an id that is not a
/// sequence number is refused.
pub(crate) fn resume_from(req: &actix_web::HttpRequest) -> Result<i64, String> {
    match req.headers().get("last-event-id") {
        None => Ok(0),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
            .filter(|seq| *seq >= 0)
            .map(|seq| seq + 1)
            .ok_or_else(|| "Last-Event-ID: must be a chunk sequence number (a non-negative integer)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_framed_line_by_line() {
        assert_eq!(
            event(Some(3), Some("chunk"), "{\"a\":1}"),
            "id: 3\nevent: chunk\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(event(None, None, "a\nb"), "data: a\ndata: b\n\n");
    }
}
