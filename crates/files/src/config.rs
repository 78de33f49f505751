use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where generated files are stored and how long their URLs work
/// (`[files]` in the configuration; docs/configuration.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct FilesConfig {
    /// `local` (a directory; the default) or `s3` (an S3-compatible bucket).
    pub backend: Backend,
    /// The local backend's directory; unset means `<data_dir>/files`.
    pub dir: Option<PathBuf>,
    /// How long a file (and its URL) lives after it was created, in seconds:
    /// 7 days by default, at most 7 days with S3 (presigned URLs last no longer).
    pub lifetime_secs: u64,
    /// Secret the local backend's URLs are signed with (any string, 32 bytes
    /// or more recommended). Unset means a random key generated once and
    /// kept in `<data_dir>/files.key`; processes serving the same files must
    /// share it.
    pub signing_key: Option<String>,
    /// Base of the local backend's URLs as clients reach the public
    /// listener, e.g. `https://models.example.com`; unset means
    /// `http://<public_addr>`.
    pub public_url: Option<String>,
    /// Objects that no job result references (a result that was never
    /// acknowledged, a crash between storing and settling) are deleted once
    /// they are this old, in seconds.
    pub orphan_grace_secs: u64,
    /// The most bytes one output file may have; a job whose worker sends a
    /// larger one fails (for good, never charged) and nothing of it is kept.
    pub max_file_bytes: u64,
    /// The most bytes all the output files of one job may have together.
    pub max_job_bytes: u64,
    pub s3: S3Config,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Local,
            dir: None,
            lifetime_secs: 7 * 24 * 3600,
            signing_key: None,
            public_url: None,
            orphan_grace_secs: 3600,
            max_file_bytes: 64 << 20,
            max_job_bytes: 256 << 20,
            s3: S3Config::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Local,
    S3,
}

/// An S3-compatible bucket. Credentials left unset are taken from the
/// standard `AWS_*` environment variables.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct S3Config {
    pub bucket: String,
    /// For S3-compatible services (MinIO, Ceph, R2, …): their URL; unset means AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow an `http://` endpoint (a local MinIO, say).
    pub allow_http: bool,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            bucket: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
        }
    }
}
