//! [`Docker`]: the Engine API client, and its [`Runtime`] implementation.
//!
//! Every call goes through three small layers: [`Docker::request`] sends one HTTP request and turns
//! transport failures into [`RuntimeError::Unavailable`]; [`Docker::call`] adds the request timeout
//! and reads the whole body; the `Runtime` methods decide which statuses are success for their
//! operation (a 304 from `stop` means "already stopped", a 404 from `remove` means "already gone")
//! and hand everything else to [`RuntimeError::from_status`].
//!
//! The API version is negotiated once per `Docker` (all clones share it): Docker 20.10 answers any
//! path versioned above 1.41 with 400 "client version is too new", and a client must not guess.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::{self, BoxStream};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::error::engine_message;
use crate::logs::LogDecoder;
use crate::transport::{Connector, Endpoint, discover, path_escape, query_escape};
use crate::types::{CreateBody, InspectBody, ListEntry, StatsBody, VersionBody, split_reference};
use crate::{Container, ContainerSpec, EngineInfo, LogLine, RegistryAuth, Runtime, RuntimeError, Stats};

/// The newest Engine API version this client is written against. Newer engines are spoken to at
/// this version (they all accept older ones); older engines at theirs.
pub const MAX_API_VERSION: (u32, u32) = (1, 43);

/// The default bound on one engine call (request sent, whole answer read). Pulls and followed logs
/// are unbounded; `stop` gets its grace period on top.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const MULTIPLEXED_STREAM: &str = "application/vnd.docker.multiplexed-stream";

/// A client of one container engine. Cloning is cheap and clones share the connection pool and the
/// negotiated API version.
#[derive(Clone)]
pub struct Docker {
    inner: Arc<Inner>,
    timeout: Duration,
}

struct Inner {
    endpoint: Endpoint,
    client: Client<Connector, Full<Bytes>>,
    negotiated: OnceCell<Negotiated>,
}

#[derive(Debug)]
struct Negotiated {
    /// `/v1.41`
    prefix: String,
    info: EngineInfo,
}

/// One engine answer, read in full.
struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    body: Bytes,
}

impl fmt::Debug for Docker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Docker")
            .field("endpoint", &self.inner.endpoint.to_string())
            .field("api_version", &self.api_version())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Docker {
    /// Finds the engine the way the Docker CLI would, then Podman: `DOCKER_HOST` (`unix://` or
    /// `tcp://`), else `/var/run/docker.sock`, else `$XDG_RUNTIME_DIR/podman/podman.sock` (rootless
    /// Podman), else `/run/podman/podman.sock`. A socket counts when the path exists; whether an
    /// engine answers on it is only known at the first call. Errors with
    /// [`RuntimeError::Unavailable`] when none is found, so that a caller can run without containers.
    pub fn from_env() -> Result<Docker, RuntimeError> {
        let docker_host = std::env::var("DOCKER_HOST").ok();
        let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
        let endpoint = discover(docker_host.as_deref(), xdg.as_deref(), |p| p.exists())?;
        Ok(Docker::with_endpoint(endpoint))
    }

    /// A client of the engine at `unix:///path` or `tcp://host:port`. Nothing is dialled yet.
    pub fn connect(host: &str) -> Result<Docker, RuntimeError> {
        Ok(Docker::with_endpoint(Endpoint::parse(host)?))
    }

    fn with_endpoint(endpoint: Endpoint) -> Docker {
        let client = Client::builder(TokioExecutor::new())
            // Engines close idle connections themselves after a while; do not hold on to them longer.
            .pool_idle_timeout(Duration::from_secs(30))
            .build(Connector::new(endpoint.clone()));
        Docker {
            inner: Arc::new(Inner {
                endpoint,
                client,
                negotiated: OnceCell::new(),
            }),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The same client with another bound on ordinary calls.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Docker {
        self.timeout = timeout;
        self
    }

    /// The engine's address, `unix:///...` or `tcp://...`.
    pub fn endpoint(&self) -> String {
        self.inner.endpoint.to_string()
    }

    /// The API version in use (`1.41`), once negotiated.
    pub fn api_version(&self) -> Option<String> {
        self.inner
            .negotiated
            .get()
            .map(|n| n.prefix.trim_start_matches("/v").to_owned())
    }

    /// Asks the engine for its version (`GET /version`, unversioned, which every engine answers) and
    /// fixes the API version of every later call to min(engine's `ApiVersion`, [`MAX_API_VERSION`]).
    ///
    /// Runs at most once per client: later calls, and the implicit call made by the first operation,
    /// return the first answer. Concurrent first calls share one request.
    pub async fn negotiate(&self) -> Result<EngineInfo, RuntimeError> {
        Ok(self.negotiated().await?.info.clone())
    }

    async fn negotiated(&self) -> Result<&Negotiated, RuntimeError> {
        self.inner
            .negotiated
            .get_or_try_init(|| async {
                let answer = self.call(Method::GET, "/version", None).await?;
                if answer.status != StatusCode::OK {
                    return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
                }
                let body: VersionBody = parse_json(&answer.body, "/version")?;
                let (major, minor) = choose_api_version(&body.api_version)?;
                let info = EngineInfo::from(body);
                tracing::debug!(endpoint = %self.inner.endpoint, engine = %info.version, api = %format!("{major}.{minor}"), "negotiated engine API version");
                Ok(Negotiated { prefix: format!("/v{major}.{minor}"), info })
            })
            .await
    }

    /// `path` under the negotiated version prefix.
    async fn versioned(&self, path: &str) -> Result<String, RuntimeError> {
        Ok(format!("{}{path}", self.negotiated().await?.prefix))
    }

    fn unavailable(&self, what: &str, err: &(dyn StdError + 'static)) -> RuntimeError {
        let mut text = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        RuntimeError::Unavailable(format!(
            "no container engine at {}: {what}: {text}",
            self.inner.endpoint
        ))
    }

    fn timed_out(&self, timeout: Duration) -> RuntimeError {
        RuntimeError::Unavailable(format!(
            "no container engine at {}: no answer within {} s",
            self.inner.endpoint,
            timeout.as_secs_f32()
        ))
    }

    /// Sends one request and returns the response head; the body is the caller's to read.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: Option<&RegistryAuth>,
    ) -> Result<Response<Incoming>, RuntimeError> {
        let uri = format!("http://{}{path}", self.inner.endpoint.authority());
        let mut req = Request::builder().method(method.clone()).uri(uri);
        let payload = match body {
            Some(json) => {
                req = req.header(CONTENT_TYPE, "application/json");
                Bytes::from(json.to_string())
            }
            None => Bytes::new(),
        };
        if let Some(auth) = auth {
            let header = HeaderValue::from_str(&registry_auth_header(auth))
                .map_err(|e| RuntimeError::Protocol(format!("registry auth header: {e}")))?;
            req = req.header("X-Registry-Auth", header);
        }
        let req = req
            .body(Full::new(payload))
            .map_err(|e| RuntimeError::Protocol(format!("building {method} {path}: {e}")))?;
        let response = self
            .inner
            .client
            .request(req)
            .await
            .map_err(|e| self.unavailable(&format!("{method} {path}"), &e))?;
        tracing::debug!(%method, path, status = response.status().as_u16(), "engine call");
        Ok(response)
    }

    /// One bounded call: the request, and its whole answer, within `self.timeout`.
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Answer, RuntimeError> {
        self.call_within(self.timeout, method, path, body).await
    }

    async fn call_within(
        &self,
        timeout: Duration,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, RuntimeError> {
        let what = format!("{method} {path}");
        let exchange = async {
            let response = self.request(method, path, body, None).await?;
            read_answer(response).await.map_err(|e| self.unavailable(&what, &*e))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| self.timed_out(timeout))?
    }

    async fn pull(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<(), RuntimeError> {
        let (repo, tag) = split_reference(image);
        let path = self
            .versioned(&format!(
                "/images/create?fromImage={}&tag={}",
                query_escape(repo),
                query_escape(tag)
            ))
            .await?;
        tracing::info!(image, registry_auth = auth.is_some(), "pulling image");
        // Unbounded: a large image takes as long as it takes, and the engine streams progress all along.
        let response = self.request(Method::POST, &path, None, auth).await?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            let message = engine_message(&bytes).unwrap_or_else(|| format!("HTTP {status}"));
            return Err(RuntimeError::Pull(format!("{image}: {message}")));
        }
        // The progress stream is JSON objects, one per line; a failure mid-way is an object with
        // `error` while the HTTP status stays 200.
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let frame = match body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Err(self.unavailable(&format!("pulling {image}"), &e)),
                None => break,
            };
            let Ok(data) = frame.into_data() else { continue };
            pending.extend_from_slice(&data);
            while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                pull_progress_line(image, &line)?;
            }
        }
        pull_progress_line(image, &pending)?;
        tracing::info!(image, "pulled image");
        Ok(())
    }

    /// Opens `GET .../logs` and returns the body with a decoder for it. Only the response head is
    /// bounded by the request timeout.
    async fn open_logs(&self, path: &str) -> Result<(Incoming, LogDecoder), RuntimeError> {
        let timeout = self.timeout;
        let response = tokio::time::timeout(timeout, self.request(Method::GET, path, None, None))
            .await
            .map_err(|_| self.timed_out(timeout))??;
        let status = response.status();
        if status != StatusCode::OK {
            let answer = tokio::time::timeout(timeout, read_answer(response))
                .await
                .map_err(|_| self.timed_out(timeout))?
                .map_err(|e| self.unavailable(path, &*e))?;
            return Err(RuntimeError::from_status(status.as_u16(), &answer.body));
        }
        let decoder = decoder_for(content_type(&response).as_deref());
        Ok((response.into_body(), decoder))
    }
}

#[async_trait]
impl Runtime for Docker {
    async fn info(&self) -> Result<EngineInfo, RuntimeError> {
        let path = self.versioned("/version").await?;
        let answer = self.call(Method::GET, &path, None).await?;
        if answer.status != StatusCode::OK {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        Ok(parse_json::<VersionBody>(&answer.body, "/version")?.into())
    }

    /// The later of two facts the engine leaves at each start, where it has them:
    /// - the default `bridge` network, which Docker removes and makes again whenever it starts
    ///   (its `Created`), so it moves with a restart of the engine alone;
    /// - the modification time of the engine's Unix socket, made by the engine at its start or, when
    ///   systemd hands the socket over (`-H fd://`), at the host's boot.
    async fn started_at(&self) -> Result<Option<i64>, RuntimeError> {
        let socket = match &self.inner.endpoint {
            Endpoint::Unix(path) => std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64),
            Endpoint::Tcp { .. } => None,
        };
        let path = self.versioned("/networks/bridge").await?;
        let answer = self.call(Method::GET, &path, None).await?;
        let bridge = match answer.status {
            StatusCode::OK => parse_json::<Value>(&answer.body, "network inspect")?
                .get("Created")
                .and_then(Value::as_str)
                .and_then(crate::parse_rfc3339_nanos)
                .map(|ns| ns.div_euclid(1_000_000)),
            StatusCode::NOT_FOUND => None,
            status => return Err(RuntimeError::from_status(status.as_u16(), &answer.body)),
        };
        Ok(socket.max(bridge))
    }

    async fn ensure_image(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<(), RuntimeError> {
        let path = self.versioned(&format!("/images/{}/json", path_escape(image))).await?;
        let answer = self.call(Method::GET, &path, None).await?;
        match answer.status {
            StatusCode::OK => Ok(()),
            StatusCode::NOT_FOUND => self.pull(image, auth).await,
            status => Err(RuntimeError::from_status(status.as_u16(), &answer.body)),
        }
    }

    async fn run(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let path = self
            .versioned(&format!("/containers/create?name={}", query_escape(&spec.name)))
            .await?;
        let answer = self.call(Method::POST, &path, Some(&spec.create_body())).await?;
        if !answer.status.is_success() {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        let created: CreateBody = parse_json(&answer.body, "container create")?;
        for warning in created.warnings.unwrap_or_default().iter().filter(|w| !w.is_empty()) {
            tracing::warn!(container = %spec.name, warning, "engine warning on create");
        }
        if let Err(start_error) = self.start(&created.id).await {
            // A created-but-never-started container would hold the name and make every retry a
            // Conflict, so run is all or nothing. The start error (e.g. "could not select device
            // driver" for a GPU request) is the one worth reporting.
            if let Err(cleanup) = self.remove(&created.id).await {
                tracing::warn!(container = %spec.name, error = %cleanup, "could not remove a container that failed to start");
            }
            return Err(start_error);
        }
        tracing::debug!(container = %spec.name, id = %created.id, "container running");
        Ok(created.id)
    }

    async fn list(&self, labels: &[(String, String)]) -> Result<Vec<Container>, RuntimeError> {
        let mut query = "/containers/json?all=1".to_owned();
        if !labels.is_empty() {
            let label: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            query.push_str("&filters=");
            query.push_str(&query_escape(&json!({ "label": label }).to_string()));
        }
        let path = self.versioned(&query).await?;
        let answer = self.call(Method::GET, &path, None).await?;
        if answer.status != StatusCode::OK {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        let entries: Vec<ListEntry> = parse_json(&answer.body, "container list")?;
        Ok(entries.into_iter().map(Container::from).collect())
    }

    async fn inspect(&self, id: &str) -> Result<Container, RuntimeError> {
        let path = self
            .versioned(&format!("/containers/{}/json", query_escape(id)))
            .await?;
        let answer = self.call(Method::GET, &path, None).await?;
        if answer.status != StatusCode::OK {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        Ok(parse_json::<InspectBody>(&answer.body, "container inspect")?.into())
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let path = self
            .versioned(&format!("/containers/{}/stop?t={secs}", query_escape(id)))
            .await?;
        // The engine answers only after the container is down, which may take the whole grace period.
        let answer = self
            .call_within(self.timeout + grace, Method::POST, &path, None)
            .await?;
        match answer.status {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_MODIFIED | StatusCode::NOT_FOUND => Ok(()),
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        let path = self
            .versioned(&format!("/containers/{}/start", query_escape(id)))
            .await?;
        let answer = self.call(Method::POST, &path, None).await?;
        match answer.status {
            s if s.is_success() || s == StatusCode::NOT_MODIFIED => Ok(()),
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let path = self
            .versioned(&format!("/containers/{}?force=1&v=1", query_escape(id)))
            .await?;
        let answer = self.call(Method::DELETE, &path, None).await?;
        match answer.status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            // An auto-remove container that has just exited is being deleted by the engine already.
            StatusCode::CONFLICT if engine_message(&answer.body).is_some_and(|m| m.contains("already in progress")) => {
                Ok(())
            }
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        let path = self
            .versioned(&format!(
                "/containers/{}/stats?stream=false&one-shot=true",
                query_escape(id)
            ))
            .await?;
        let answer = self.call(Method::GET, &path, None).await?;
        if !answer.status.is_success() {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        Ok(parse_json::<StatsBody>(&answer.body, "container stats")?.into())
    }

    async fn ensure_network(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let found = self.versioned(&format!("/networks/{}", query_escape(name))).await?;
        if self.call(Method::GET, &found, None).await?.status.is_success() {
            return Ok(());
        }
        let path = self.versioned("/networks/create").await?;
        let body = serde_json::json!({"Name": name, "Driver": "bridge", "Labels": labels, "CheckDuplicate": true});
        let answer = self.call(Method::POST, &path, Some(&body)).await?;
        match answer.status {
            s if s.is_success() || s == StatusCode::CONFLICT => Ok(()),
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn remove_network(&self, name: &str) -> Result<(), RuntimeError> {
        let path = self.versioned(&format!("/networks/{}", query_escape(name))).await?;
        let answer = self.call(Method::DELETE, &path, None).await?;
        match answer.status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            // "error while removing network: network ... has active endpoints"
            StatusCode::FORBIDDEN => Err(RuntimeError::Conflict(
                String::from_utf8_lossy(&answer.body).into_owned(),
            )),
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<(), RuntimeError> {
        let path = self.versioned(&format!("/volumes/{}", query_escape(name))).await?;
        let answer = self.call(Method::DELETE, &path, None).await?;
        match answer.status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            s => Err(RuntimeError::from_status(s.as_u16(), &answer.body)),
        }
    }

    async fn logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> Result<Vec<LogLine>, RuntimeError> {
        let path = self.versioned(&logs_path(id, tail, since_unix_secs, false)).await?;
        let answer = self.call(Method::GET, &path, None).await?;
        if answer.status != StatusCode::OK {
            return Err(RuntimeError::from_status(answer.status.as_u16(), &answer.body));
        }
        let mut decoder = decoder_for(answer.content_type.as_deref());
        decoder.push(&answer.body)?;
        decoder.finish();
        Ok(std::iter::from_fn(|| decoder.pop()).collect())
    }

    fn follow_logs(
        &self,
        id: &str,
        tail: Option<u32>,
        since_unix_secs: Option<i64>,
    ) -> BoxStream<'static, Result<LogLine, RuntimeError>> {
        enum State {
            Open(Docker, String),
            Reading(Incoming, LogDecoder),
            Draining(LogDecoder),
            Done,
        }
        let start = State::Open(self.clone(), logs_path(id, tail, since_unix_secs, true));
        stream::unfold(start, |mut state| async move {
            loop {
                state = match state {
                    State::Done => return None,
                    State::Open(docker, path) => {
                        let opened = match docker.versioned(&path).await {
                            Ok(full) => docker.open_logs(&full).await,
                            Err(e) => Err(e),
                        };
                        match opened {
                            Ok((body, decoder)) => State::Reading(body, decoder),
                            Err(e) => return Some((Err(e), State::Done)),
                        }
                    }
                    State::Reading(mut body, mut decoder) => {
                        if let Some(line) = decoder.pop() {
                            return Some((Ok(line), State::Reading(body, decoder)));
                        }
                        match body.frame().await {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data()
                                    && let Err(e) = decoder.push(&data)
                                {
                                    return Some((Err(e), State::Done));
                                }
                                State::Reading(body, decoder)
                            }
                            Some(Err(e)) => {
                                let err = RuntimeError::Unavailable(format!("log stream broke: {e}"));
                                return Some((Err(err), State::Done));
                            }
                            // The engine ends a followed stream when the container stops.
                            None => {
                                decoder.finish();
                                State::Draining(decoder)
                            }
                        }
                    }
                    State::Draining(mut decoder) => {
                        return decoder.pop().map(|line| (Ok(line), State::Draining(decoder)));
                    }
                };
            }
        })
        .boxed()
    }
}

/// `X-Registry-Auth`: URL-safe base64 of the JSON credentials, as the Docker CLI sends it.
fn registry_auth_header(auth: &RegistryAuth) -> String {
    let json = json!({"username": auth.username, "password": auth.password, "serveraddress": auth.server});
    base64::engine::general_purpose::URL_SAFE.encode(json.to_string())
}

/// Parses `1.41` and caps it at [`MAX_API_VERSION`].
fn choose_api_version(engine: &str) -> Result<(u32, u32), RuntimeError> {
    let parsed = engine
        .trim()
        .split_once('.')
        .and_then(|(major, minor)| Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?)));
    let version =
        parsed.ok_or_else(|| RuntimeError::Protocol(format!("engine API version {engine:?} is not MAJOR.MINOR")))?;
    Ok(version.min(MAX_API_VERSION))
}

fn logs_path(id: &str, tail: Option<u32>, since_unix_secs: Option<i64>, follow: bool) -> String {
    let mut path = format!("/containers/{}/logs?stdout=1&stderr=1&timestamps=1", query_escape(id));
    match tail {
        Some(n) => path.push_str(&format!("&tail={n}")),
        None => path.push_str("&tail=all"),
    }
    if let Some(since) = since_unix_secs {
        path.push_str(&format!("&since={since}"));
    }
    if follow {
        path.push_str("&follow=1");
    }
    path
}

fn content_type(response: &Response<Incoming>) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Only the 1.42+ multiplexed content type is conclusive; `raw-stream` is what older engines send
/// for both encodings, so anything else is left to the decoder's first-byte check.
fn decoder_for(content_type: Option<&str>) -> LogDecoder {
    match content_type {
        Some(ct) if ct.starts_with(MULTIPLEXED_STREAM) => LogDecoder::with_multiplexed(true),
        _ => LogDecoder::new(),
    }
}

async fn read_answer(response: Response<Incoming>) -> Result<Answer, Box<dyn StdError + Send + Sync>> {
    let status = response.status();
    let content_type = content_type(&response);
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, RuntimeError> {
    serde_json::from_slice(body).map_err(|e| RuntimeError::Protocol(format!("{what}: {e}")))
}

/// Checks one line of a pull's progress stream for an error.
fn pull_progress_line(image: &str, line: &[u8]) -> Result<(), RuntimeError> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return Ok(());
    }
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        tracing::debug!(image, line = text, "unparsable pull progress line");
        return Ok(());
    };
    let detail = value.pointer("/errorDetail/message").and_then(Value::as_str);
    match value.get("error").and_then(Value::as_str).or(detail) {
        Some(message) => Err(RuntimeError::Pull(format!("{image}: {message}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_is_usable_as_a_shared_trait_object() {
        let runtime: Arc<dyn Runtime> = Arc::new(Docker::connect("unix:///run/none.sock").unwrap());
        let _clone = Arc::clone(&runtime);
    }

    #[test]
    fn api_version_is_capped_at_the_newest_this_client_knows() {
        assert_eq!(choose_api_version("1.41").unwrap(), (1, 41));
        assert_eq!(choose_api_version("1.43").unwrap(), (1, 43));
        assert_eq!(choose_api_version("1.53").unwrap(), (1, 43));
        assert_eq!(choose_api_version("2.0").unwrap(), (1, 43));
        assert_eq!(choose_api_version("1.9").unwrap(), (1, 9));
        assert!(matches!(choose_api_version("latest"), Err(RuntimeError::Protocol(_))));
        assert!(matches!(choose_api_version(""), Err(RuntimeError::Protocol(_))));
    }

    #[test]
    fn registry_auth_header_is_url_safe_base64_json() {
        let auth = RegistryAuth {
            username: "u?".into(),
            password: "p>>?".into(),
            server: "r.example:5000".into(),
        };
        let header = registry_auth_header(&auth);
        assert!(!header.contains('+') && !header.contains('/'), "{header}");
        let decoded = base64::engine::general_purpose::URL_SAFE.decode(&header).unwrap();
        let value: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(
            value,
            json!({"username": "u?", "password": "p>>?", "serveraddress": "r.example:5000"})
        );
    }

    #[test]
    fn pull_progress_errors_are_found() {
        assert!(pull_progress_line("i", br#"{"status":"Pulling from library/x","id":"1"}"#).is_ok());
        assert!(pull_progress_line("i", b"  \r\n").is_ok());
        assert!(pull_progress_line("i", b"garbage").is_ok());
        let err = pull_progress_line(
            "i",
            br#"{"errorDetail":{"message":"manifest unknown"},"error":"manifest unknown"}"#,
        );
        assert!(matches!(err, Err(RuntimeError::Pull(m)) if m == "i: manifest unknown"));
        let err = pull_progress_line("i", br#"{"errorDetail":{"message":"only detail"}}"#);
        assert!(matches!(err, Err(RuntimeError::Pull(m)) if m.ends_with("only detail")));
    }

    #[test]
    fn logs_paths() {
        assert_eq!(
            logs_path("abc", None, None, false),
            "/containers/abc/logs?stdout=1&stderr=1&timestamps=1&tail=all"
        );
        assert_eq!(
            logs_path("abc", Some(10), Some(1_700_000_000), true),
            "/containers/abc/logs?stdout=1&stderr=1&timestamps=1&tail=10&since=1700000000&follow=1"
        );
    }
}
