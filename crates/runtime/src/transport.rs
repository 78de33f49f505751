//! Where the engine is and how bytes get there: address parsing, socket discovery, and the connector
//! that lets hyper-util's pooled client speak HTTP/1.1 over a Unix socket or plain TCP.
//!
//! hyper-util's own `HttpConnector` only does TCP, and a Unix-socket connector crate would be one more
//! dependency for about forty lines, so the connector is written here. The request URI's authority is
//! irrelevant for a Unix socket (the engine ignores `Host`), so all Unix requests go to
//! `http://localhost`, and the connector dials the configured endpoint whatever the URI says.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::RuntimeError;

/// The port of an unencrypted Docker TCP listener, used when a `tcp://` address names none.
const DEFAULT_TCP_PORT: u16 = 2375;

/// The system Docker socket, tried after `DOCKER_HOST`.
pub(crate) const DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// Rootful Podman's socket, tried last.
pub(crate) const PODMAN_SYSTEM_SOCKET: &str = "/run/podman/podman.sock";

/// A container engine's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl Endpoint {
    /// Parses `unix:///path` or `tcp://host[:port]` (the forms `DOCKER_HOST` takes). `http://` is
    /// accepted as a synonym of `tcp://`; TLS (`DOCKER_TLS_VERIFY`) and `ssh://` are not supported.
    pub(crate) fn parse(address: &str) -> Result<Endpoint, RuntimeError> {
        let unsupported = |why: &str| {
            RuntimeError::Unavailable(format!(
                "unsupported container engine address {address:?} ({why}); expected unix:///path or tcp://host:port"
            ))
        };
        if let Some(path) = address.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(unsupported("the socket path must be absolute"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some(rest) = address
            .strip_prefix("tcp://")
            .or_else(|| address.strip_prefix("http://"))
        else {
            return Err(unsupported("unknown scheme"));
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| unsupported("unclosed '['"))?;
            match after.strip_prefix(':') {
                Some(port) => (host, port.parse().map_err(|_| unsupported("bad port"))?),
                None if after.is_empty() => (host, DEFAULT_TCP_PORT),
                None => return Err(unsupported("junk after the address")),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().map_err(|_| unsupported("bad port"))?),
                None => (rest, DEFAULT_TCP_PORT),
            }
        };
        if host.is_empty() || host.contains('/') {
            return Err(unsupported("no host"));
        }
        Ok(Endpoint::Tcp {
            host: host.to_owned(),
            port,
        })
    }

    /// The authority of request URIs for this endpoint.
    pub(crate) fn authority(&self) -> String {
        match self {
            Endpoint::Unix(_) => "localhost".to_owned(),
            Endpoint::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Endpoint::Tcp { host, port } => format!("{host}:{port}"),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            Endpoint::Tcp { .. } => write!(f, "tcp://{}", self.authority()),
        }
    }
}

/// The discovery order of [`crate::Docker::from_env`], with the environment and the file system
/// passed in so that it can be tested without touching either.
pub(crate) fn discover(
    docker_host: Option<&str>,
    xdg_runtime_dir: Option<&Path>,
    exists: impl Fn(&Path) -> bool,
) -> Result<Endpoint, RuntimeError> {
    if let Some(host) = docker_host.map(str::trim).filter(|h| !h.is_empty()) {
        return Endpoint::parse(host);
    }
    let mut candidates = vec![PathBuf::from(DOCKER_SOCKET)];
    if let Some(dir) = xdg_runtime_dir.filter(|d| !d.as_os_str().is_empty()) {
        candidates.push(dir.join("podman/podman.sock"));
    }
    candidates.push(PathBuf::from(PODMAN_SYSTEM_SOCKET));
    if let Some(found) = candidates.iter().find(|p| exists(p)) {
        return Ok(Endpoint::Unix(found.clone()));
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(RuntimeError::Unavailable(format!(
        "no container engine found: DOCKER_HOST is not set and none of {} exists",
        tried.join(", ")
    )))
}

/// Dials the endpoint for hyper-util's client, whatever URI it is asked for.
#[derive(Clone)]
pub(crate) struct Connector {
    endpoint: Arc<Endpoint>,
}

impl Connector {
    pub(crate) fn new(endpoint: Endpoint) -> Connector {
        Connector {
            endpoint: Arc::new(endpoint),
        }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<EngineStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let endpoint = Arc::clone(&self.endpoint);
        Box::pin(async move {
            let stream = match &*endpoint {
                Endpoint::Unix(path) => EngineStream::Unix(UnixStream::connect(path).await?),
                Endpoint::Tcp { host, port } => {
                    let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                    // Engine calls are small request/response pairs; Nagle only adds latency.
                    tcp.set_nodelay(true)?;
                    EngineStream::Tcp(tcp)
                }
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// A connection to the engine, over either transport.
pub(crate) enum EngineStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Connection for EngineStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for EngineStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EngineStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            EngineStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EngineStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EngineStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            EngineStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EngineStream::Unix(s) => Pin::new(s).poll_flush(cx),
            EngineStream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EngineStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            EngineStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Percent-encodes a query parameter value (everything but RFC 3986's unreserved characters).
pub(crate) fn query_escape(s: &str) -> String {
    escape(s, b"-._~")
}

/// Percent-encodes a path segment that may itself contain `/`, `:` and `@` (an image reference, which
/// the engine routes with a greedy pattern).
pub(crate) fn path_escape(s: &str) -> String {
    escape(s, b"-._~/:@")
}

fn escape(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            Endpoint::parse("unix:///run/x.sock").unwrap(),
            Endpoint::Unix("/run/x.sock".into())
        );
        assert_eq!(
            Endpoint::parse("tcp://10.0.0.1:2376").unwrap(),
            Endpoint::Tcp {
                host: "10.0.0.1".into(),
                port: 2376
            }
        );
        assert_eq!(
            Endpoint::parse("tcp://docker").unwrap(),
            Endpoint::Tcp {
                host: "docker".into(),
                port: 2375
            }
        );
        assert_eq!(
            Endpoint::parse("http://h:1/").unwrap(),
            Endpoint::Tcp {
                host: "h".into(),
                port: 1
            }
        );
        let v6 = Endpoint::parse("tcp://[::1]:2375").unwrap();
        assert_eq!(
            v6,
            Endpoint::Tcp {
                host: "::1".into(),
                port: 2375
            }
        );
        assert_eq!(v6.to_string(), "tcp://[::1]:2375");
        assert_eq!(Endpoint::parse("unix:///a/b").unwrap().to_string(), "unix:///a/b");
        for bad in [
            "",
            "/var/run/docker.sock",
            "ssh://u@h",
            "unix://relative",
            "tcp://",
            "tcp://h:notaport",
            "tcp://[::1",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(RuntimeError::Unavailable(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn discovery_order_is_docker_host_then_docker_then_podman() {
        let none = |_: &Path| false;
        let xdg = Some(Path::new("/run/user/1000"));
        assert_eq!(
            discover(Some("tcp://h:1"), xdg, |_| true).unwrap(),
            Endpoint::Tcp {
                host: "h".into(),
                port: 1
            }
        );
        assert_eq!(
            discover(Some("  "), xdg, |_| true).unwrap(),
            Endpoint::Unix(DOCKER_SOCKET.into())
        );
        assert_eq!(
            discover(None, xdg, |p| p != Path::new(DOCKER_SOCKET)).unwrap(),
            Endpoint::Unix("/run/user/1000/podman/podman.sock".into())
        );
        assert_eq!(
            discover(None, None, |p| p == Path::new(PODMAN_SYSTEM_SOCKET)).unwrap(),
            Endpoint::Unix(PODMAN_SYSTEM_SOCKET.into())
        );
        match discover(None, xdg, none) {
            Err(RuntimeError::Unavailable(m)) => assert!(m.contains("/run/user/1000/podman/podman.sock"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(
            query_escape(r#"{"label":["a=b c"]}"#),
            "%7B%22label%22%3A%5B%22a%3Db%20c%22%5D%7D"
        );
        assert_eq!(
            path_escape("localhost:5000/a/b@sha256:ff"),
            "localhost:5000/a/b@sha256:ff"
        );
        assert_eq!(path_escape("a b?"), "a%20b%3F");
    }
}
