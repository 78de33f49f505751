use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

use gantry_proto::v1::{FileChunk, OutputFile, Progress, StreamChunk, WorkerMessage, worker_message::Kind};
use serde_json::Value;
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::JobError;

/// Handle a running job uses to talk to the scheduler.
///
/// Cheap to clone. Messages sent through it travel on the worker's single
/// ordered stream, so every progress message and chunk reaches the scheduler
/// before the job's result.
#[derive(Clone)]
pub struct JobContext {
    inner: Arc<Inner>,
}

struct Inner {
    job_id: String,
    attempt: u32,
    deadline: Option<SystemTime>,
    cancel: CancellationToken,
    /// Weak, so a context kept alive past its job does not hold the stream
    /// open.
    out: mpsc::WeakSender<WorkerMessage>,
    /// Places for file chunks in the stream's queue: a file writer takes
    /// one per chunk, and the stream gives it back when it sends the chunk.
    file_chunks: Arc<Semaphore>,
    /// Next chunk sequence number; the lock is held while the chunk is
    /// queued so sequence numbers and stream order always agree.
    next_seq: Mutex<u64>,
    /// Files sent whole so far, listed in the result.
    files: Mutex<Vec<OutputFile>>,
    /// The id of the next file begun.
    next_file: AtomicU32,
}

/// Size of one [`FileChunk`]: well below the gRPC message limit, large
/// enough that a 100 MB video is a hundred messages.
pub const FILE_CHUNK_BYTES: usize = 1 << 20;

impl JobContext {
    pub(crate) fn new(
        job_id: String,
        attempt: u32,
        deadline: Option<SystemTime>,
        cancel: CancellationToken,
        out: mpsc::WeakSender<WorkerMessage>,
        file_chunks: Arc<Semaphore>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                job_id,
                attempt,
                deadline,
                cancel,
                out,
                file_chunks,
                next_seq: Mutex::new(0),
                files: Mutex::new(Vec::new()),
                next_file: AtomicU32::new(0),
            }),
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.inner.job_id
    }

    /// The attempt number (the scheduler increments it on every retry).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// When the job must be finished, if it has a deadline. When it passes
    /// the job is cancelled and reported as a non-retryable failure.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.inner.deadline
    }

    /// Whether the job was cancelled (by the scheduler or its deadline).
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Resolves once the job is cancelled. Race it against long waits, e.g.
    /// in `tokio::select!`, and return [`JobError::Cancelled`] when it wins.
    /// A job that ignores cancellation is dropped at its next `.await` after a
    /// grace period ([`WorkerConfig::cancel_grace`](crate::WorkerConfig)).
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await;
    }

    /// A token that is cancelled together with the job, to hand to code that
    /// knows `tokio_util` tokens.
    pub fn cancellation_token(&self) -> crate::CancellationToken {
        self.inner.cancel.clone()
    }

    /// Reports progress (any JSON, e.g. `{"step": 3, "of": 20}`).
    pub async fn progress(&self, message: Value) -> Result<(), JobError> {
        let kind = Kind::Progress(Progress {
            job_id: self.inner.job_id.clone(),
            attempt: self.inner.attempt,
            message_json: message.to_string(),
        });
        self.send(kind).await
    }

    /// Emits the next chunk of streamed output. Chunks are numbered from 0 in
    /// the order of the calls.
    pub async fn chunk(&self, output: Value) -> Result<(), JobError> {
        let mut next_seq = self.inner.next_seq.lock().await;
        let kind = Kind::StreamChunk(StreamChunk {
            job_id: self.inner.job_id.clone(),
            attempt: self.inner.attempt,
            seq: *next_seq,
            output_json: output.to_string(),
        });
        self.send(kind).await?;
        *next_seq += 1;
        Ok(())
    }

    /// Sends an output file (an image, audio, a video) and puts its URL at
    /// `json_pointer` (RFC 6901, for example `"/image_url"` or `"/images/0"`)
    /// of the job's output: readers of the job see an expiring URL there, in
    /// place of whatever the output holds at that spot. The bytes travel now,
    /// in chunks of [`FILE_CHUNK_BYTES`], and the scheduler stores them; they
    /// become part of the result only if the job then succeeds, and are
    /// deleted otherwise. A file made piece by piece need not be held whole:
    /// see [`Self::create_file`].
    pub async fn put_file(&self, json_pointer: &str, media_type: &str, data: &[u8]) -> Result<(), JobError> {
        let mut file = self.create_file(json_pointer, media_type)?;
        file.write(data).await?;
        file.finish().await
    }

    /// Begins an output file that is written piece by piece
    /// ([`FileWriter::write`]) and sent as it grows, so that at most
    /// [`FILE_CHUNK_BYTES`] of it is in the worker's memory at a time. It is
    /// part of the result once [`FileWriter::finish`] returns; a writer
    /// dropped unfinished leaves nothing behind. Several files may be
    /// written at once. The scheduler bounds each file and all the files of
    /// a job (`files.max_file_bytes`, `files.max_job_bytes`): past either,
    /// the job fails for good, whatever it returns.
    pub fn create_file(&self, json_pointer: &str, media_type: &str) -> Result<FileWriter, JobError> {
        if !json_pointer.starts_with('/') {
            return Err(JobError::internal(format!(
                "file pointer {json_pointer:?} must start with '/'"
            )));
        }
        let media_type = if media_type.is_empty() {
            "application/octet-stream"
        } else {
            media_type
        };
        let file_id = self.inner.next_file.fetch_add(1, Ordering::Relaxed);
        if file_id == u32::MAX {
            return Err(JobError::internal("too many output files"));
        }
        Ok(FileWriter {
            ctx: self.clone(),
            file_id,
            json_pointer: json_pointer.to_owned(),
            media_type: media_type.to_owned(),
            sent: 0,
            buffer: Vec::new(),
        })
    }

    /// The files sent so far (for the result).
    pub(crate) async fn take_files(&self) -> Vec<OutputFile> {
        std::mem::take(&mut *self.inner.files.lock().await)
    }

    async fn send(&self, kind: Kind) -> Result<(), JobError> {
        let out = self.inner.out.upgrade().ok_or_else(lost_connection)?;
        out.send(WorkerMessage { kind: Some(kind) })
            .await
            .map_err(|_| lost_connection())
    }
}

/// An output file being written: bytes given to [`Self::write`] go to the
/// scheduler a chunk ([`FILE_CHUNK_BYTES`]) at a time. Made by
/// [`JobContext::create_file`].
pub struct FileWriter {
    ctx: JobContext,
    file_id: u32,
    json_pointer: String,
    media_type: String,
    /// Bytes sent so far (the offset of the buffer's first byte).
    sent: u64,
    buffer: Vec<u8>,
}

impl FileWriter {
    /// Appends `data`, sending every whole chunk it completes.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<(), JobError> {
        while !data.is_empty() {
            let room = FILE_CHUNK_BYTES - self.buffer.len();
            let (now, rest) = data.split_at(room.min(data.len()));
            self.buffer.extend_from_slice(now);
            data = rest;
            if self.buffer.len() == FILE_CHUNK_BYTES {
                self.send(false).await?;
            }
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.sent + self.buffer.len() as u64
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends what is left and adds the file to the job's result.
    pub async fn finish(mut self) -> Result<(), JobError> {
        self.send(true).await?;
        self.ctx.inner.files.lock().await.push(OutputFile {
            file_id: self.file_id,
            json_pointer: std::mem::take(&mut self.json_pointer),
        });
        Ok(())
    }

    /// Sends the buffer as the next chunk (the first one names the media
    /// type; the last one may be empty).
    async fn send(&mut self, last: bool) -> Result<(), JobError> {
        // Wait for a place in the queue first: a fast writer is held to the
        // pace of the stream rather than queueing the whole file in memory,
        // and a write given up while it waits here keeps its bytes.
        let place = self
            .ctx
            .inner
            .file_chunks
            .acquire()
            .await
            .map_err(|_| lost_connection())?;
        place.forget();
        let data = std::mem::take(&mut self.buffer);
        let len = data.len() as u64;
        let chunk = FileChunk {
            job_id: self.ctx.inner.job_id.clone(),
            attempt: self.ctx.inner.attempt,
            file_id: self.file_id,
            media_type: if self.sent == 0 {
                self.media_type.clone()
            } else {
                String::new()
            },
            offset: self.sent,
            data,
            last,
        };
        self.ctx.send(Kind::FileChunk(chunk)).await?;
        self.sent += len;
        Ok(())
    }
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("file_id", &self.file_id)
            .field("json_pointer", &self.json_pointer)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

fn lost_connection() -> JobError {
    JobError::internal("connection to the scheduler was lost")
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("job_id", &self.inner.job_id)
            .field("attempt", &self.inner.attempt)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer is held to the pace of the stream: with two places for
    /// chunks and nothing taking them, the third chunk waits until the
    /// stream takes one (gives its place back).
    #[tokio::test]
    async fn a_file_writer_waits_for_the_stream_to_take_its_chunks() {
        let (tx, mut rx) = mpsc::channel(256);
        let places = Arc::new(Semaphore::new(2));
        let ctx = JobContext::new(
            "job".into(),
            1,
            None,
            CancellationToken::new(),
            tx.downgrade(),
            Arc::clone(&places),
        );
        let mut file = ctx.create_file("/file_url", "text/plain").unwrap();
        let chunk = vec![7u8; FILE_CHUNK_BYTES];
        file.write(&chunk).await.unwrap();
        file.write(&chunk).await.unwrap();
        let third = tokio::time::timeout(std::time::Duration::from_millis(200), file.write(&chunk)).await;
        assert!(third.is_err(), "a third chunk went out with no place free");
        // The stream takes the first chunk; with places free, the third
        // (kept while it waited), a fourth and the end go out.
        let taken = rx.recv().await.unwrap();
        assert!(matches!(taken.kind, Some(Kind::FileChunk(ref c)) if c.offset == 0 && c.media_type == "text/plain"));
        places.add_permits(3);
        file.write(&chunk).await.unwrap();
        file.finish().await.unwrap();
        let mut offsets = Vec::new();
        while let Ok(message) = rx.try_recv() {
            if let Some(Kind::FileChunk(c)) = message.kind {
                offsets.push((c.offset, c.data.len(), c.last));
            }
        }
        let mib = FILE_CHUNK_BYTES as u64;
        assert_eq!(
            offsets,
            vec![
                (mib, FILE_CHUNK_BYTES, false),
                (2 * mib, FILE_CHUNK_BYTES, false),
                (3 * mib, FILE_CHUNK_BYTES, false),
                (4 * mib, 0, true)
            ]
        );
        assert_eq!(ctx.take_files().await.len(), 1);
        drop(tx);
    }
}
