//! Output files arriving on a worker's stream.
//!
//! A worker sends each file as a run of `FileChunk`s before the `Result` that
//! lists it. The stream's reader task owns one [`Assembly`]: it hands chunks
//! to the configured [`FileSink`] as they arrive (so a file never sits in
//! memory whole), and when the `Result` comes it swaps the result's file list
//! for the stored files. Files of an attempt that fails, is cancelled, lists
//! a file that did not arrive whole, or whose stream ends are discarded.

use std::collections::HashMap;
use std::sync::Arc;

use gantry_proto::v1::{FileChunk, OutputFile};
use serde::{Deserialize, Serialize};

/// A file the sink stored, as the job layer keeps it with the job's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Where the file's URL goes in the job's output (RFC 6901).
    pub pointer: String,
    /// The object's key in the file store.
    pub key: String,
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// When the file was stored (Unix ms); its URL expires a configured time
    /// after this.
    pub created_ms: i64,
}

/// Where output files go: the file store implements it. Workers never see
/// it; they only stream bytes to the scheduler.
#[tonic::async_trait]
pub trait FileSink: Send + Sync + 'static {
    /// Starts storing file `file_id` of an attempt.
    async fn begin(
        &self,
        job_id: &str,
        attempt: u32,
        file_id: u32,
        media_type: &str,
    ) -> Result<Box<dyn FileUpload>, String>;

    /// Deletes files that will not be part of any result (best effort: the
    /// store's sweeper deletes what this misses).
    async fn discard(&self, files: Vec<StoredFile>);

    /// The most bytes one file, and all the files of one attempt, may have.
    fn limits(&self) -> FileLimits {
        FileLimits::default()
    }
}

/// Bounds on what one attempt may store; a file past them fails its job for
/// good (the same input would make the same file again) and nothing of it is
/// kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    pub file_bytes: u64,
    pub attempt_bytes: u64,
}

impl Default for FileLimits {
    fn default() -> Self {
        Self {
            file_bytes: u64::MAX,
            attempt_bytes: u64::MAX,
        }
    }
}

/// Why the files of an attempt cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) error: String,
    /// Whether another attempt may do better (a store that failed), or the
    /// job fails for good (a file over the limits).
    pub(crate) retryable: bool,
}

/// One file being stored.
#[tonic::async_trait]
pub trait FileUpload: Send {
    async fn write(&mut self, data: Vec<u8>) -> Result<(), String>;
    /// Completes the file; `pointer` of the result is left empty.
    async fn finish(self: Box<Self>) -> Result<StoredFile, String>;
    /// Gives up on the file, removing what was written.
    async fn abort(self: Box<Self>);
}

type Attempt = (String, u32);

struct Open {
    upload: Box<dyn FileUpload>,
    next_offset: u64,
}

/// The files of one worker stream.
pub(crate) struct Assembly {
    sink: Option<Arc<dyn FileSink>>,
    open: HashMap<(String, u32, u32), Open>,
    done: HashMap<Attempt, HashMap<u32, StoredFile>>,
    /// Attempts whose files cannot be trusted any more, and why.
    broken: HashMap<Attempt, Refused>,
    /// Bytes each attempt has sent, over all its files.
    sent: HashMap<Attempt, u64>,
}

impl Assembly {
    pub(crate) fn new(sink: Option<Arc<dyn FileSink>>) -> Self {
        Self {
            sink,
            open: HashMap::new(),
            done: HashMap::new(),
            broken: HashMap::new(),
            sent: HashMap::new(),
        }
    }

    /// Stores one chunk of an attempt that runs on this stream.
    pub(crate) async fn chunk(&mut self, chunk: FileChunk) {
        let attempt = (chunk.job_id.clone(), chunk.attempt);
        if self.broken.contains_key(&attempt) {
            return;
        }
        let Some(sink) = self.sink.clone() else {
            self.break_attempt(attempt, "this scheduler has no file store configured".into())
                .await;
            return;
        };
        let key = (chunk.job_id.clone(), chunk.attempt, chunk.file_id);
        if chunk.offset == 0 && !self.open.contains_key(&key) {
            if self
                .done
                .get(&attempt)
                .is_some_and(|files| files.contains_key(&chunk.file_id))
            {
                let error = format!("file {} was sent twice", chunk.file_id);
                self.break_attempt(attempt, error).await;
                return;
            }
            // Stored as text in every database and signed into the URL: a
            // type that is not one (a control character, a NUL, no subtype)
            // is stored as plain bytes.
            let media_type = if is_media_type(&chunk.media_type) {
                chunk.media_type.as_str()
            } else {
                if !chunk.media_type.is_empty() {
                    tracing::warn!(job_id = %chunk.job_id, media_type = ?chunk.media_type,
                        "a worker's file has an invalid media type; stored as application/octet-stream");
                }
                OCTET_STREAM
            };
            match sink
                .begin(&chunk.job_id, chunk.attempt, chunk.file_id, media_type)
                .await
            {
                Ok(upload) => {
                    self.open.insert(key.clone(), Open { upload, next_offset: 0 });
                }
                Err(error) => {
                    self.break_attempt(attempt, format!("storing an output file failed: {error}"))
                        .await;
                    return;
                }
            }
        }
        let Some(mut open) = self.open.remove(&key) else {
            let error = format!("file {} chunk at offset {} has no start", chunk.file_id, chunk.offset);
            self.break_attempt(attempt, error).await;
            return;
        };
        if open.next_offset != chunk.offset {
            open.upload.abort().await;
            let error = format!(
                "file {} chunk at offset {} (expected {})",
                chunk.file_id, chunk.offset, open.next_offset
            );
            self.break_attempt(attempt, error).await;
            return;
        }
        open.next_offset += chunk.data.len() as u64;
        let limits = sink.limits();
        let sent = self.sent.entry(attempt.clone()).or_default();
        *sent = sent.saturating_add(chunk.data.len() as u64);
        let over = if open.next_offset > limits.file_bytes {
            Some(format!(
                "output file {} is larger than {} bytes, the most one file may have",
                chunk.file_id, limits.file_bytes
            ))
        } else if *sent > limits.attempt_bytes {
            Some(format!(
                "the output files are larger than {} bytes, the most one job may store",
                limits.attempt_bytes
            ))
        } else {
            None
        };
        if let Some(error) = over {
            open.upload.abort().await;
            self.refuse(attempt, error, false).await;
            return;
        }
        if let Err(error) = open.upload.write(chunk.data).await {
            open.upload.abort().await;
            self.break_attempt(attempt, format!("storing an output file failed: {error}"))
                .await;
            return;
        }
        if !chunk.last {
            self.open.insert(key, open);
            return;
        }
        match open.upload.finish().await {
            Ok(stored) => {
                self.done.entry(attempt).or_default().insert(chunk.file_id, stored);
            }
            Err(error) => {
                self.break_attempt(attempt, format!("storing an output file failed: {error}"))
                    .await;
            }
        }
    }

    /// The stored files a result lists, each with its pointer; files of the
    /// attempt that the result does not list are discarded. An error fails
    /// the attempt (retryably: the next attempt sends its files again).
    pub(crate) async fn result(
        &mut self,
        job_id: &str,
        attempt: u32,
        listed: &[OutputFile],
    ) -> Result<Vec<StoredFile>, Refused> {
        let id = (job_id.to_owned(), attempt);
        let mut done = self.done.remove(&id).unwrap_or_default();
        self.sent.remove(&id);
        if let Some(refused) = self.broken.remove(&id) {
            self.abort_open(&id).await;
            self.discard(done.into_values().collect()).await;
            return Err(refused);
        }
        let unfinished = self.abort_open(&id).await;
        let mut error = None;
        let mut files = Vec::with_capacity(listed.len());
        for file in listed {
            if error.is_some() {
                break;
            }
            if !valid_pointer(&file.json_pointer) {
                error = Some(format!(
                    "file {} has an invalid pointer {:?}",
                    file.file_id, file.json_pointer
                ));
                break;
            }
            match done.remove(&file.file_id) {
                Some(mut stored) => {
                    stored.pointer = file.json_pointer.clone();
                    files.push(stored);
                }
                None if unfinished.contains(&file.file_id) => {
                    error = Some(format!("file {} did not arrive whole", file.file_id));
                }
                None => error = Some(format!("file {} was listed but never sent", file.file_id)),
            }
        }
        let mut unused: Vec<StoredFile> = done.into_values().collect();
        let outcome = match error {
            Some(error) => {
                unused.append(&mut files);
                Err(Refused { error, retryable: true })
            }
            None => Ok(files),
        };
        self.discard(unused).await;
        outcome
    }

    /// Discards everything of an attempt that ended without a result.
    pub(crate) async fn ended(&mut self, job_id: &str, attempt: u32) {
        let id = (job_id.to_owned(), attempt);
        self.broken.remove(&id);
        self.sent.remove(&id);
        self.abort_open(&id).await;
        if let Some(done) = self.done.remove(&id) {
            self.discard(done.into_values().collect()).await;
        }
    }

    /// Discards everything (the stream ended).
    pub(crate) async fn close(&mut self) {
        for (_, open) in self.open.drain() {
            open.upload.abort().await;
        }
        let done: Vec<StoredFile> = self.done.drain().flat_map(|(_, files)| files.into_values()).collect();
        self.broken.clear();
        self.sent.clear();
        self.discard(done).await;
    }

    /// The attempt's files cannot be used (another attempt may do better).
    async fn break_attempt(&mut self, attempt: Attempt, error: String) {
        self.refuse(attempt, error, true).await;
    }

    async fn refuse(&mut self, attempt: Attempt, error: String, retryable: bool) {
        tracing::warn!(job_id = %attempt.0, attempt = attempt.1, %error, "output file refused");
        self.abort_open(&attempt).await;
        if let Some(done) = self.done.remove(&attempt) {
            self.discard(done.into_values().collect()).await;
        }
        self.broken.insert(attempt, Refused { error, retryable });
    }

    /// Aborts the unfinished files of an attempt; returns their ids.
    async fn abort_open(&mut self, attempt: &Attempt) -> Vec<u32> {
        let keys: Vec<_> = self
            .open
            .keys()
            .filter(|(job, n, _)| job == &attempt.0 && *n == attempt.1)
            .cloned()
            .collect();
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(open) = self.open.remove(&key) {
                open.upload.abort().await;
                ids.push(key.2);
            }
        }
        ids
    }

    pub(crate) async fn discard(&mut self, files: Vec<StoredFile>) {
        if let (false, Some(sink)) = (files.is_empty(), &self.sink) {
            sink.discard(files).await;
        }
    }
}

/// The media type of bytes of no known type.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Whether `text` is a media type as RFC 6838 and RFC 9110 spell one:
/// `type/subtype` of restricted-name characters, then `; name=value`
/// parameters of visible ASCII, at most 255 bytes in all. Nothing else is
/// stored, so a stored type is always safe in a header and in any database.
pub fn is_media_type(text: &str) -> bool {
    fn restricted_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && name.len() <= 127
            && chars.all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
    }
    if text.len() > 255 || !text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return false;
    }
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or_default();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    restricted_name(kind)
        && restricted_name(subtype)
        && parts.all(|parameter| {
            parameter
                .trim()
                .split_once('=')
                .is_some_and(|(name, value)| restricted_name(name) && !value.is_empty())
        })
}

/// An RFC 6901 pointer below the root: `/` followed by tokens where `~` is
/// only ever `~0` or `~1`.
fn valid_pointer(pointer: &str) -> bool {
    pointer.starts_with('/') && {
        let mut chars = pointer.chars();
        let mut ok = true;
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                ok = false;
                break;
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::{is_media_type, valid_pointer};

    #[test]
    fn media_types() {
        for good in [
            "image/png",
            "audio/ogg; codecs=opus",
            "text/plain;charset=utf-8",
            "application/vnd.a+json",
        ] {
            assert!(is_media_type(good), "{good}");
        }
        for bad in [
            "",
            "a\u{0}",
            "image/png\u{0}",
            "text/html\r\nx-evil: 1",
            "image",
            "/png",
            "image/",
            "image/png; =x",
            "image/png; a=",
            "ïmage/png",
            &format!("image/{}", "a".repeat(300)),
        ] {
            assert!(!is_media_type(bad), "{bad:?}");
        }
    }

    #[test]
    fn pointers() {
        assert!(valid_pointer("/image_url"));
        assert!(valid_pointer("/images/0"));
        assert!(valid_pointer("/a~1b/~0"));
        assert!(!valid_pointer(""));
        assert!(!valid_pointer("image_url"));
        assert!(!valid_pointer("/a~2"));
        assert!(!valid_pointer("/a~"));
    }
}
