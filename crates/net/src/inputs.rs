//! Files that callers pass in a job's input (the keyframes of
//! `interpolate-video`, the audio of a transcription): an `http(s)` URL that
//! the worker fetches through the address guard, a `data:` URL, or plain
//! base64, each bounded in size.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;

use crate::{AddressPolicy, client, error_chain, tls_config};

/// A file named in a job's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An `http(s)` URL, fetched when the job runs.
    Url(String),
    /// The file itself, from a `data:` URL or plain base64.
    Bytes(Vec<u8>),
}

impl Source {
    /// Reads `text` as an `http(s)` URL, a base64 `data:` URL or plain
    /// base64. `what` names the field in the errors.
    pub fn parse(text: &str, what: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.starts_with("https://") || text.starts_with("http://") {
            return Ok(Self::Url(text.to_owned()));
        }
        let data = match text.strip_prefix("data:") {
            Some(rest) => {
                let (meta, data) = rest
                    .split_once(',')
                    .ok_or("a data: URL needs a comma before its data")?;
                if !meta.ends_with(";base64") {
                    return Err("a data: URL must be base64 (data:<media type>;base64,...)".into());
                }
                data
            }
            None => text,
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .map_err(|e| format!("not an http(s) URL, a data: URL or base64 ({e})"))?;
        if bytes.is_empty() {
            return Err(format!("the {what} is empty"));
        }
        Ok(Self::Bytes(bytes))
    }
}

/// What [`OwnFiles::read`] answers.
pub type OwnRead<'a> = Pin<Box<dyn Future<Output = Option<Result<Vec<u8>, String>>> + Send + 'a>>;

/// The platform's own generated files, read by their URLs from the file store
/// rather than over HTTP: a job can take the URL another job's output holds
/// (a voice to transcribe, say), even where the platform's address is one
/// that fetches are refused (loopback in the embedded default).
pub trait OwnFiles: Send + Sync + std::fmt::Debug {
    /// `None` when `url` is not one of the platform's file URLs (with a valid
    /// signature); else the file's bytes, at most `max_bytes`, or why not.
    fn read<'a>(&'a self, url: &'a reqwest::Url, max_bytes: usize) -> OwnRead<'a>;
}

/// Fetches input URLs from permitted addresses only (loopback, private and
/// reserved addresses are refused unless the operator allowed their
/// ranges), without following redirects, each within a time and size bound.
/// The platform's own file URLs are read from its store (see [`OwnFiles`]).
#[derive(Clone)]
pub struct Fetcher {
    http: reqwest::Client,
    policy: Arc<AddressPolicy>,
    own: Option<Arc<dyn OwnFiles>>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("policy", &self.policy)
            .field("own_files", &self.own.is_some())
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher that also reaches `allow_ranges` (CIDR), each request
    /// bounded by `timeout`.
    pub fn new(allow_ranges: &[String], timeout: Duration) -> Result<Self, String> {
        let policy = Arc::new(AddressPolicy::new(allow_ranges)?);
        let tls = tls_config(None)?;
        let http = client(policy.clone(), timeout, tls).map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            http,
            policy,
            own: None,
        })
    }

    /// This fetcher, reading the platform's own file URLs from `own`.
    #[must_use]
    pub fn with_own_files(mut self, own: Option<Arc<dyn OwnFiles>>) -> Self {
        self.own = own;
        self
    }

    /// The bytes of `source`: fetched when it is a URL, refused when larger
    /// than `max_bytes`.
    pub async fn bytes(&self, source: &Source, max_bytes: usize) -> Result<Vec<u8>, String> {
        match source {
            Source::Url(url) => self.get(url, max_bytes).await,
            Source::Bytes(bytes) if bytes.len() > max_bytes => Err(too_large("the file", max_bytes)),
            Source::Bytes(bytes) => Ok(bytes.clone()),
        }
    }

    /// The body at `url`, at most `max_bytes` of it.
    pub async fn get(&self, url: &str, max_bytes: usize) -> Result<Vec<u8>, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url} is not a URL: {e}"))?;
        if let Some(own) = &self.own
            && let Some(read) = own.read(&parsed, max_bytes).await
        {
            return read;
        }
        self.policy.check_url(&parsed)?;
        let mut response = self
            .http
            .get(parsed)
            .send()
            .await
            .map_err(|e| format!("cannot fetch {url}: {}", error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(format!("fetching {url} answered {}", response.status()));
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("cannot fetch {url}: {e}"))? {
            if bytes.len() + chunk.len() > max_bytes {
                return Err(too_large(url, max_bytes));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}

fn too_large(what: &str, max_bytes: usize) -> String {
    format!("{what} is larger than {} MiB", max_bytes >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_data_urls_and_base64() {
        assert_eq!(
            Source::parse(" https://example.com/a.wav ", "audio"),
            Ok(Source::Url("https://example.com/a.wav".into()))
        );
        assert_eq!(
            Source::parse("data:audio/wav;base64,AQID", "audio"),
            Ok(Source::Bytes(vec![1, 2, 3]))
        );
        assert_eq!(Source::parse("AQID", "audio"), Ok(Source::Bytes(vec![1, 2, 3])));
        assert!(
            Source::parse("data:audio/wav,abc", "audio")
                .unwrap_err()
                .contains("must be base64")
        );
        assert!(Source::parse("data:abc", "audio").unwrap_err().contains("comma"));
        assert!(
            Source::parse("ftp://x", "audio")
                .unwrap_err()
                .contains("not an http(s) URL")
        );
        assert_eq!(Source::parse("", "audio"), Err("the audio is empty".into()));
    }

    #[tokio::test]
    async fn inline_files_are_bounded_and_private_addresses_refused() {
        let fetcher = Fetcher::new(&[], Duration::from_secs(5)).unwrap();
        let big = Source::Bytes(vec![0; 3 << 20]);
        assert_eq!(
            fetcher.bytes(&big, 2 << 20).await,
            Err("the file is larger than 2 MiB".into())
        );
        let small = Source::Bytes(vec![7; 10]);
        assert_eq!(fetcher.bytes(&small, 2 << 20).await.unwrap(), vec![7; 10]);
        let refused = fetcher.get("http://127.0.0.1:9/a.wav", 1 << 20).await.unwrap_err();
        assert!(refused.contains("127.0.0.1"), "{refused}");
    }
}
