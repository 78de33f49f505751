//! Following a job as it runs: its chunks in order as they are produced,
//! then its final view. The HTTP side turns the frames into Server-Sent
//! Events (`GET /v2/{model_id}/stream/{job_id}`) or OpenAI stream chunks.
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

use serde_json::Value;
use tokio::sync::mpsc;

use crate::store::JobStore;
use crate::types::{JobError, JobView};

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
/// A `KeepAlive` frame is sent after this long without any other, so a
/// transport can keep its connection open through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Frames buffered per reader before the reader waits for the client.
const BUFFER: usize = 64;

/// What a reader sees, in order: chunks, then exactly one `Final` (or an error).
pub enum Frame {
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
pub struct Follow {
    pub user: String,
    pub model: String,
    pub job_id: String,
    /// First chunk sequence number to deliver.
    pub from: i64,
    /// Cancel the job if the client goes away before it ends (a stream that
    /// owns its job, as an OpenAI streaming request does).
    pub cancel_on_disconnect: bool,
}

impl JobStore {
    /// Follows the caller's job: starts a reader task whose frames arrive on
    /// the returned channel. The task ends after the final frame, or as soon
    /// as the receiver is dropped.
    pub fn follow(&self, follow: Follow) -> mpsc::Receiver<Frame> {
        let (tx, rx) = mpsc::channel(BUFFER);
        tokio::spawn(read(self.clone(), follow, tx));
        rx
    }
}

async fn read(jobs: JobStore, f: Follow, tx: mpsc::Sender<Frame>) {
    let live = jobs.watch_stream(&f.job_id);
    let mut cursor = live.cursor(f.from);
    let reread = if jobs.live_delivery() {
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
            match jobs.chunks_from(&f.user, &f.model, &f.job_id, cursor.next).await {
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
                return disconnected(&jobs, &f, ends || is_final).await;
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
                        return disconnected(&jobs, &f, false).await;
                    }
                    quiet_since = tokio::time::Instant::now();
                }
            }
            () = tx.closed() => return disconnected(&jobs, &f, false).await,
        }
    }
}

async fn disconnected(jobs: &JobStore, f: &Follow, is_final: bool) {
    if f.cancel_on_disconnect && !is_final {
        tracing::debug!(job_id = %f.job_id, "stream reader went away: cancelling its job");
        if let Err(error) = jobs.cancel(&f.user, &f.model, &f.job_id).await {
            tracing::warn!(job_id = %f.job_id, %error, "could not cancel the job of a closed stream");
        }
    }
}
