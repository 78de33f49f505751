//! Following a job as it runs: its chunks in order as they are produced,
//! then its final view. Shared by `GET /v2/{model_id}/stream/{job_id}` with
//! `Accept: text/event-stream` and by the OpenAI-compatible streaming routes.
//!
//! A reader takes chunks and progress from the job store's live feed as
//! workers send them, without reading the database (the feed reaches this
//! process from its own scheduler, or over Redis signals from another). It
//! reads the database at the start, when the job may have ended, and when the
//! chunk it needs next is not in the feed (it joined late, fell behind, or a
//! signal was lost). Each reader keeps its own position, so any number of
//! readers (and a reconnecting one with `Last-Event-ID`) see every chunk once
//! and in order.
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use gantry_scheduler::{JobError, JobStore, JobView};
use serde_json::Value;
use tokio::sync::mpsc;

/// How long a reader that hears nothing waits before reading the job again
/// anyway, when this process gets live output: a safety net for a lost
/// signal.
const REREAD_LIVE: Duration = Duration::from_secs(1);
/// The same, when this process gets no live output (no scheduler here and no
/// Redis signals): then it is how the reader follows the job.
const REREAD_POLLING: Duration = Duration::from_millis(250);
/// First wait for a chunk known to exist but not in the live feed (or, before
/// the feed has carried anything, for output sent before the reader
/// subscribed), doubled while it is missing (up to the reread period); a
/// wake-up on its storage ends the wait sooner.
const GAP_FIRST_WAIT: Duration = Duration::from_millis(10);
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
        let mut cursor = live.cursor(f.from);
        let reread = if f.jobs.live_delivery() {
            REREAD_LIVE
        } else {
            REREAD_POLLING
        };
        let mut read = true;
        let mut gap_wait = GAP_FIRST_WAIT;
        let mut quiet_since = tokio::time::Instant::now();
        let mut progress: Option<Value> = None;
        loop {
            // Subscribed before reading: anything arriving in between wakes the wait below.
            let notified = live.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut frames = Vec::new();
            if std::mem::take(&mut read) {
                match f.jobs.chunks_from(&f.user, &f.model, &f.job_id, cursor.next).await {
                    Err(error) => {
                        let _ = tx.send(Frame::Failed(error)).await;
                        return;
                    }
                    Ok((view, chunks)) => {
                        for (seq, output) in chunks {
                            cursor.next = seq + 1;
                            frames.push(Frame::Chunk { seq, output });
                        }
                        if view.status.is_final() {
                            frames.push(Frame::Final(Box::new(view)));
                        } else if let Some(message) = view.progress {
                            frames.push(Frame::Progress(message));
                        }
                    }
                }
            }
            let taken = live.take(&mut cursor);
            let ends = frames.last().is_some_and(|frame| matches!(frame, Frame::Final(_)));
            if !ends {
                frames.extend(
                    taken
                        .chunks
                        .into_iter()
                        .map(|(seq, output)| Frame::Chunk { seq, output }),
                );
                frames.extend(taken.progress.map(Frame::Progress));
            }
            for frame in frames {
                let is_final = matches!(frame, Frame::Final(_));
                if let Frame::Progress(message) = &frame {
                    if progress.as_ref() == Some(message) {
                        continue;
                    }
                    progress = Some(message.clone());
                }
                if tx.send(frame).await.is_err() {
                    return disconnected(&f, ends || is_final).await;
                }
                quiet_since = tokio::time::Instant::now();
                if is_final {
                    return;
                }
            }
            // Something is missing: the next chunk, or (until the feed has
            // carried anything) output sent before this reader subscribed,
            // which a process without the job's scheduler hears no storage of.
            let missing = taken.gap || !taken.fed;
            if !missing {
                gap_wait = GAP_FIRST_WAIT;
            }
            // The job may have ended, or what is missing is now stored (the
            // next chunk, or output sent before the feed carried anything).
            if taken.ended || (taken.stored && missing) {
                read = true;
                continue;
            }
            let wait = if missing { gap_wait } else { reread };
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(wait) => {
                    read = true;
                    if missing {
                        gap_wait = (gap_wait * 2).min(reread);
                    }
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
/// SSE text by `render` (which may skip a frame by returning nothing) as the
/// response is written. The body ends after the final frame.
pub(crate) fn sse_response(
    frames: mpsc::Receiver<Frame>,
    render: impl FnMut(Frame) -> Option<String> + 'static,
) -> HttpResponse {
    let body = futures_util::stream::unfold((frames, render, false), |(mut frames, mut render, ended)| async move {
        if ended {
            return None;
        }
        loop {
            let frame = frames.recv().await?;
            let last = matches!(frame, Frame::Final(_) | Frame::Failed(_));
            match render(frame) {
                Some(text) => {
                    let item: Result<Bytes, actix_web::Error> = Ok(Bytes::from(text));
                    return Some((item, (frames, render, last)));
                }
                None if last => return None,
                None => {}
            }
        }
    });
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body)
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
