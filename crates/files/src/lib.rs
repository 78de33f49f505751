//! Generated files: where they are stored and the URLs they are read by.
//!
//! Workers stream output files (images, audio, video) to the scheduler with
//! the job's result; [`Files`] stores them (the [`FileSink`] the dispatcher
//! writes into), on local disk under the data dir (the embedded default) or
//! in an S3-compatible bucket. A reader of the job sees a URL at each file's
//! place in the output, computed when the job is read (never stored) and
//! valid until the file's lifetime (7 days by default) after it was created:
//! for local disk a URL of Gantry's own public listener signed with HMAC-SHA256
//! over the key, media type and expiry ([`Files::verify`]), for S3 a presigned
//! `GET`. The scheduler's sweeper deletes files past their lifetime and
//! objects no result ever referenced.

mod config;
mod signing;
mod upload;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::signer::Signer;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use serde_json::Value;

pub use config::{Backend, FilesConfig, S3Config};
pub use gantry_dispatch::{FileSink, StoredFile};
pub use signing::Denied;

/// Where every object key starts.
const PREFIX: &str = "jobs";

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("file store configuration: {0}")]
    Config(String),
    #[error("file not found")]
    NotFound,
    #[error("file store: {0}")]
    Store(#[from] object_store::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The file store; cheap to clone.
#[derive(Clone)]
pub struct Files {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// Set for the S3 backend: URLs are presigned by it.
    s3: Option<Arc<AmazonS3>>,
    key: signing::Key,
    lifetime: Duration,
    /// Base of the local backend's URLs, without a trailing slash.
    public_url: std::sync::RwLock<String>,
    /// Whether `public_url` was configured (else it follows the listener).
    public_url_configured: bool,
    orphan_grace: Duration,
    limits: gantry_dispatch::FileLimits,
    backend: Backend,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files")
            .field("backend", &self.inner.backend)
            .field("lifetime", &self.inner.lifetime)
            .field("public_url", &self.public_url())
            .finish_non_exhaustive()
    }
}

/// A byte range of a file and the stream of its bytes.
pub struct Ranged {
    /// The whole file's size.
    pub size: u64,
    /// The bytes sent.
    pub range: Range<u64>,
    pub body: BoxStream<'static, Result<Bytes, FilesError>>,
}

impl Files {
    /// Opens the store `config` describes. `data_dir` holds the local
    /// backend's files and the generated signing key; `default_public_url`
    /// is the base of local URLs when `config.public_url` is unset.
    pub fn open(config: &FilesConfig, data_dir: &Path, default_public_url: &str) -> Result<Self, FilesError> {
        let lifetime = Duration::from_secs(config.lifetime_secs.max(1));
        let (store, s3): (Arc<dyn ObjectStore>, Option<Arc<AmazonS3>>) = match config.backend {
            Backend::Local => {
                let dir = config.dir.clone().unwrap_or_else(|| data_dir.join("files"));
                std::fs::create_dir_all(&dir)?;
                let local = LocalFileSystem::new_with_prefix(&dir)?.with_automatic_cleanup(true);
                (Arc::new(local), None)
            }
            Backend::S3 => {
                if lifetime > Duration::from_secs(7 * 24 * 3600) {
                    return Err(FilesError::Config(
                        "files.lifetime_secs is at most 604800 (7 days) with S3: presigned URLs last no longer".into(),
                    ));
                }
                let s3 = Arc::new(s3_store(&config.s3)?);
                (s3.clone(), Some(s3))
            }
        };
        let key = signing::Key::load_or_create(config.signing_key.as_deref(), data_dir)?;
        let public_url_configured = config.public_url.as_deref().is_some_and(|u| !u.is_empty());
        let public_url = config
            .public_url
            .clone()
            .filter(|_| public_url_configured)
            .unwrap_or_else(|| default_public_url.to_owned())
            .trim_end_matches('/')
            .to_owned();
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                s3,
                key,
                lifetime,
                public_url: std::sync::RwLock::new(public_url),
                public_url_configured,
                orphan_grace: Duration::from_secs(config.orphan_grace_secs),
                limits: gantry_dispatch::FileLimits {
                    file_bytes: config.max_file_bytes,
                    attempt_bytes: config.max_job_bytes,
                },
                backend: config.backend,
            }),
        })
    }

    /// The public listener is bound at `addr`: without a configured
    /// `public_url`, local URLs point there (loopback for an unspecified
    /// address: set `files.public_url` when clients are elsewhere).
    pub fn listening_at(&self, addr: std::net::SocketAddr) {
        if self.inner.public_url_configured {
            return;
        }
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let url = format!("http://{addr}");
        *self
            .inner
            .public_url
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = url;
    }

    fn public_url(&self) -> String {
        self.inner
            .public_url
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How long a file's URL works after the file was created.
    pub fn lifetime(&self) -> Duration {
        self.inner.lifetime
    }

    /// How old an object no result references must be before the sweeper
    /// deletes it.
    pub fn orphan_grace(&self) -> Duration {
        self.inner.orphan_grace
    }

    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The sink the dispatcher stores arriving files with.
    pub fn sink(&self) -> Arc<dyn FileSink> {
        Arc::new(upload::Sink { files: self.clone() })
    }

    /// Unix ms at which `file`'s URL stops working.
    pub fn expires_ms(&self, file: &StoredFile) -> i64 {
        file.created_ms
            .saturating_add(i64::try_from(self.inner.lifetime.as_millis()).unwrap_or(i64::MAX))
    }

    /// The URL `file` is read by now.
    pub async fn url(&self, file: &StoredFile) -> String {
        let expires_ms = self.expires_ms(file);
        if let Some(s3) = &self.inner.s3 {
            // A presigned URL lasts from now: give it what is left of the
            // file's lifetime (at least a second, so it is a valid URL).
            let left = u64::try_from(expires_ms.saturating_sub(now_ms()))
                .unwrap_or(0)
                .max(1000);
            let path = ObjectPath::from(file.key.as_str());
            return match s3
                .signed_url(object_store::signer::Method::GET, &path, Duration::from_millis(left))
                .await
            {
                Ok(url) => url.to_string(),
                Err(error) => {
                    tracing::error!(key = %file.key, %error, "presigning a file URL failed");
                    String::new()
                }
            };
        }
        let expires = expires_ms.div_euclid(1000);
        let sig = self.inner.key.sign(&file.key, &file.media_type, expires);
        let mut url = format!("{}/files/{}", self.public_url(), file.key);
        url.push('?');
        url.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .append_pair("type", &file.media_type)
                .append_pair("expires", &expires.to_string())
                .append_pair("sig", &sig)
                .finish(),
        );
        url
    }

    /// Puts each file's URL at its pointer in `output`, creating the object
    /// members on the way where they are missing.
    pub async fn resolve(&self, output: &mut Value, files: &[StoredFile]) {
        for file in files {
            let url = self.url(file).await;
            place(output, &file.pointer, Value::String(url));
        }
    }

    /// Checks a local URL's signature and expiry (`expires` in Unix seconds).
    pub fn verify(&self, key: &str, media_type: &str, expires: i64, sig: &str) -> Result<(), Denied> {
        self.inner
            .key
            .verify(key, media_type, expires, sig, now_ms().div_euclid(1000))
    }

    /// The key of one of this store's local file URLs
    /// (`…/files/jobs/…?type=…&expires=…&sig=…` with a signature this store
    /// made), whatever host it names: `None` when `url` is not one,
    /// `Some(Err(Expired))` when it is but its time is up.
    pub fn own_key(&self, url: &url::Url) -> Option<Result<String, Denied>> {
        if self.is_s3() {
            return None;
        }
        let key = url
            .path()
            .strip_prefix("/files/")
            .filter(|key| key.starts_with("jobs/"))?;
        let (mut media_type, mut expires, mut sig) = (None, None, None);
        for (name, value) in url.query_pairs() {
            match name.as_ref() {
                "type" => media_type = Some(value.into_owned()),
                "expires" => expires = value.parse::<i64>().ok(),
                "sig" => sig = Some(value.into_owned()),
                _ => {}
            }
        }
        match self.verify(key, &media_type?, expires?, &sig?) {
            Ok(()) => Some(Ok(key.to_owned())),
            Err(Denied::Expired) => Some(Err(Denied::Expired)),
            Err(Denied::BadSignature) => None,
        }
    }

    /// [`Self::own_key`] of `text` when it is a URL.
    pub fn own_key_of(&self, text: &str) -> Option<Result<String, Denied>> {
        if !text.starts_with("http://") && !text.starts_with("https://") {
            return None;
        }
        self.own_key(&url::Url::parse(text).ok()?)
    }

    /// All of the object `key`, refused when larger than `max_bytes`.
    async fn read_whole(&self, key: &str, max_bytes: usize) -> Result<Vec<u8>, String> {
        let ranged = self.read(key, None).await.map_err(|error| match error {
            ReadError::NotFound => "the file no longer exists (its lifetime ended)".to_owned(),
            other => format!("the file cannot be read: {other}"),
        })?;
        if ranged.size > max_bytes as u64 {
            return Err(format!("the file is larger than {} MiB", max_bytes >> 20));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(ranged.size).unwrap_or(0));
        let mut body = ranged.body;
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.map_err(|e| format!("the file cannot be read: {e}"))?);
        }
        Ok(bytes)
    }

    /// Reads `range` (all of it when `None`) of the object `key`. A range
    /// past the end is `Err(Unsatisfiable(size))`.
    pub async fn read(&self, key: &str, range: Option<RangeRequest>) -> Result<Ranged, ReadError> {
        let path = ObjectPath::parse(key).map_err(|_| ReadError::NotFound)?;
        let meta = match self.inner.store.head(&path).await {
            Ok(meta) => meta,
            Err(object_store::Error::NotFound { .. }) => return Err(ReadError::NotFound),
            Err(error) => return Err(ReadError::Store(error.into())),
        };
        let size = meta.size;
        let range = match range {
            None => 0..size,
            Some(request) => request.resolve(size).ok_or(ReadError::Unsatisfiable(size))?,
        };
        if range.is_empty() {
            let body: BoxStream<'static, Result<Bytes, FilesError>> = futures_util::stream::empty().boxed();
            return Ok(Ranged { size, range, body });
        }
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        let result = match self.inner.store.get_opts(&path, options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Err(ReadError::NotFound),
            Err(error) => return Err(ReadError::Store(error.into())),
        };
        let body = result
            .into_stream()
            .map(|chunk| chunk.map_err(FilesError::from))
            .boxed();
        Ok(Ranged { size, range, body })
    }

    /// Deletes objects (missing ones are fine).
    pub async fn delete(&self, keys: &[String]) -> Result<(), FilesError> {
        for key in keys {
            let Ok(path) = ObjectPath::parse(key) else { continue };
            match self.inner.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Every stored object: (key, last modified in Unix ms).
    pub async fn list(&self) -> Result<Vec<(String, i64)>, FilesError> {
        let prefix = ObjectPath::from(PREFIX);
        let mut stream = self.inner.store.list(Some(&prefix));
        let mut found = Vec::new();
        while let Some(meta) = stream.next().await {
            match meta {
                Ok(meta) => found.push((meta.location.to_string(), meta.last_modified.timestamp_millis())),
                // A file removed while listing.
                Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(found)
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    pub(crate) fn is_s3(&self) -> bool {
        self.inner.s3.is_some()
    }
}

/// A job's input may name a file another job made by its URL: the worker
/// reads it here, from the store, instead of fetching it over HTTP (see
/// `gantry_net::OwnFiles`).
impl gantry_net::OwnFiles for Files {
    fn read<'a>(&'a self, url: &'a url::Url, max_bytes: usize) -> gantry_net::OwnRead<'a> {
        Box::pin(async move {
            Some(match self.own_key(url)? {
                Ok(key) => self.read_whole(&key, max_bytes).await,
                Err(denied) => Err(format!("a file URL of this platform that cannot be read: {denied}")),
            })
        })
    }
}

/// Why a file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("file not found")]
    NotFound,
    /// The requested range starts past the end (the file's size).
    #[error("range not satisfiable")]
    Unsatisfiable(u64),
    #[error(transparent)]
    Store(FilesError),
}

/// One range of an HTTP `Range: bytes=…` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRequest {
    /// `first-last` (inclusive) or `first-`.
    From { first: u64, last: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix(u64),
}

impl RangeRequest {
    /// Parses a `Range` header with a single byte range. `None` for anything
    /// else (other units, several ranges, bad syntax): the whole file is
    /// sent then, as RFC 9110 allows.
    pub fn parse(header: &str) -> Option<Self> {
        let spec = header.trim().strip_prefix("bytes=")?.trim();
        if spec.contains(',') {
            return None;
        }
        let (first, last) = spec.split_once('-')?;
        let number = |s: &str| -> Option<u64> {
            let s = s.trim();
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
        };
        if first.trim().is_empty() {
            return Some(Self::Suffix(number(last)?));
        }
        let first = number(first)?;
        let last = if last.trim().is_empty() {
            None
        } else {
            Some(number(last)?)
        };
        if last.is_some_and(|last| last < first) {
            return None;
        }
        Some(Self::From { first, last })
    }

    /// The bytes this asks for of a file of `size` bytes; `None` when it
    /// cannot be satisfied (416).
    pub fn resolve(self, size: u64) -> Option<Range<u64>> {
        match self {
            Self::From { first, last } => {
                if first >= size {
                    return None;
                }
                let end = last.map_or(size, |last| last.saturating_add(1).min(size));
                Some(first..end)
            }
            // No suffix of an empty file can be sent (RFC 9110, 14.1.1).
            Self::Suffix(0) => None,
            Self::Suffix(_) if size == 0 => None,
            Self::Suffix(n) => Some(size.saturating_sub(n)..size),
        }
    }
}

/// Sets `value` at `pointer` (RFC 6901) in `target`, creating missing object
/// members; an array index may address an element or one past the end.
pub fn place(target: &mut Value, pointer: &str, value: Value) {
    let Some(rest) = pointer.strip_prefix('/') else {
        return;
    };
    let tokens: Vec<String> = rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let mut node = target;
    for (i, token) in tokens.iter().enumerate() {
        let last = i + 1 == tokens.len();
        if !node.is_object() && !node.is_array() {
            *node = Value::Object(serde_json::Map::new());
        }
        let next = match node {
            Value::Array(items) => {
                let Ok(index) = token.parse::<usize>() else { return };
                if index == items.len() {
                    items.push(Value::Null);
                }
                match items.get_mut(index) {
                    Some(item) => item,
                    None => return,
                }
            }
            Value::Object(map) => map.entry(token.clone()).or_insert(Value::Null),
            _ => return,
        };
        if last {
            *next = value;
            return;
        }
        node = next;
    }
}

/// The object key of a file: `jobs/<job id>/<attempt>/<file id>.<ext>`.
pub(crate) fn object_key(job_id: &str, attempt: u32, file_id: u32, media_type: &str) -> String {
    let safe: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{PREFIX}/{safe}/{attempt}/{file_id}.{}", extension(media_type))
}

/// A file name extension for a media type (for people and download tools;
/// the served `Content-Type` is the signed media type itself).
/// Whether a file of `media_type` is served as that type, to be shown in a
/// browser: the types the models make and a few plain ones, none of which
/// runs script. Every other type is served as `application/octet-stream`, as
/// an attachment, so no caller-chosen type (`text/html`, `image/svg+xml`)
/// renders on the platform's origin.
pub fn served_inline(media_type: &str) -> bool {
    gantry_dispatch::is_media_type(media_type) && extension(media_type) != "bin"
}

fn extension(media_type: &str) -> &'static str {
    let essence = media_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.as_str() {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/webp" => "webp",
        "image/gif" => "gif",
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/mpeg" => "mp3",
        "audio/ogg" => "ogg",
        "audio/flac" => "flac",
        "video/mp4" => "mp4",
        "video/webm" => "webm",
        "application/json" => "json",
        "text/plain" => "txt",
        _ => "bin",
    }
}

fn s3_store(config: &S3Config) -> Result<AmazonS3, FilesError> {
    if config.bucket.is_empty() {
        return Err(FilesError::Config(
            "files.s3.bucket must be set for the s3 backend".into(),
        ));
    }
    // reqwest is built without a default TLS provider; ring is the
    // process's (installing it twice is harmless).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&config.bucket)
        .with_region(&config.region)
        .with_allow_http(config.allow_http);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(id) = &config.access_key_id {
        builder = builder.with_access_key_id(id);
    }
    if let Some(secret) = &config.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    builder.build().map_err(|error| FilesError::Config(error.to_string()))
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranges() {
        assert_eq!(
            RangeRequest::parse("bytes=0-9").and_then(|r| r.resolve(100)),
            Some(0..10)
        );
        assert_eq!(
            RangeRequest::parse("bytes=90-").and_then(|r| r.resolve(100)),
            Some(90..100)
        );
        assert_eq!(
            RangeRequest::parse("bytes=-10").and_then(|r| r.resolve(100)),
            Some(90..100)
        );
        assert_eq!(
            RangeRequest::parse("bytes=-500").and_then(|r| r.resolve(100)),
            Some(0..100)
        );
        assert_eq!(
            RangeRequest::parse("bytes=95-200").and_then(|r| r.resolve(100)),
            Some(95..100)
        );
        assert_eq!(RangeRequest::parse("bytes=100-").map(|r| r.resolve(100)), Some(None));
        assert_eq!(RangeRequest::parse("bytes=-0").map(|r| r.resolve(100)), Some(None));
        assert_eq!(RangeRequest::parse("bytes=-5").map(|r| r.resolve(0)), Some(None));
        assert_eq!(RangeRequest::parse("bytes=0-").map(|r| r.resolve(0)), Some(None));
        assert_eq!(RangeRequest::parse("bytes=5-1"), None);
        assert_eq!(RangeRequest::parse("bytes=0-1,5-9"), None);
        assert_eq!(RangeRequest::parse("items=0-1"), None);
        assert_eq!(RangeRequest::parse("bytes=a-b"), None);
    }

    /// A URL this store signed is its own on any host; a changed one, or
    /// one of another path, is not; an expired one is, and says so.
    #[tokio::test]
    async fn own_file_urls_are_recognised_by_their_signature() {
        let dir = tempfile::tempdir().unwrap();
        let config = FilesConfig {
            signing_key: Some("a test key of thirty-two bytes or more".into()),
            ..FilesConfig::default()
        };
        let files = Files::open(&config, dir.path(), "http://127.0.0.1:8081").unwrap();
        let file = |created_ms| StoredFile {
            pointer: "/audio_url".into(),
            key: "jobs/j1/1/0.wav".into(),
            media_type: "audio/wav".into(),
            size: 3,
            created_ms,
        };
        let url = files.url(&file(now_ms())).await;
        assert_eq!(files.own_key_of(&url), Some(Ok("jobs/j1/1/0.wav".into())));
        let elsewhere = url.replace("127.0.0.1:8081", "files.example.com");
        assert_eq!(files.own_key_of(&elsewhere), Some(Ok("jobs/j1/1/0.wav".into())));
        assert_eq!(files.own_key_of(&url.replacen("sig=", "sig=0", 1)), None);
        assert_eq!(files.own_key_of(&url.replace("/0.wav", "/1.wav")), None);
        assert_eq!(files.own_key_of("http://127.0.0.1:8081/v2/models"), None);
        assert_eq!(files.own_key_of("not a url"), None);
        let old = files.url(&file(now_ms() - 8 * 24 * 3600 * 1000)).await;
        assert_eq!(files.own_key_of(&old), Some(Err(Denied::Expired)));
    }

    #[test]
    fn placing_urls() {
        let mut output = json!({"cost": 1});
        place(&mut output, "/image_url", json!("u"));
        assert_eq!(output, json!({"cost": 1, "image_url": "u"}));
        let mut output = json!({"images": [null, null]});
        place(&mut output, "/images/1", json!("b"));
        place(&mut output, "/images/2", json!("c"));
        place(&mut output, "/images/9", json!("lost"));
        assert_eq!(output, json!({"images": [null, "b", "c"]}));
        let mut output = json!(null);
        place(&mut output, "/a~1b/c", json!(1));
        assert_eq!(output, json!({"a/b": {"c": 1}}));
    }

    #[test]
    fn keys_are_safe_paths() {
        assert_eq!(object_key("ab-1", 2, 0, "image/png"), "jobs/ab-1/2/0.png");
        assert_eq!(object_key("a/../b", 1, 3, "x/unknown"), "jobs/a____b/1/3.bin");
    }
}
