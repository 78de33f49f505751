//! The client against a scripted stand-in engine on a Unix socket, for what the real test engine
//! cannot be made to do: announce an API version newer than this client knows, fail a pull in the
//! middle of its progress stream, or send the 1.42+ multiplexed content type. Needs no Docker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use gantry_runtime::{Docker, LogStream, RegistryAuth, Runtime, RuntimeError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

/// A request as the fake engine saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

type Handler = Arc<dyn Fn(&Seen) -> (u16, &'static str, Vec<u8>) + Send + Sync>;

struct FakeEngine {
    dir: std::path::PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeEngine {
    fn start(name: &str, handler: Handler) -> FakeEngine {
        let dir = std::env::temp_dir().join(format!("gantry-rt-fake-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("engine.sock")).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, Arc::clone(&handler), Arc::clone(&log)));
            }
        });
        FakeEngine { dir, seen, task }
    }

    fn docker(&self) -> Docker {
        Docker::connect(&format!("unix://{}", self.dir.join("engine.sock").display())).unwrap()
    }

    fn paths(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|s| s.path.clone()).collect()
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Minimal HTTP/1.1: requests without bodies (or with a Content-Length body, skipped), keep-alive.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut conn: S, handler: Handler, log: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next().unwrap_or_default().split(' ');
        let method = request_line.next().unwrap_or_default().to_owned();
        let path = request_line.next().unwrap_or_default().to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body_len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + body_len {
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + body_len);
        let seen = Seen { method, path, headers };
        log.lock().unwrap().push(seen.clone());
        let (status, content_type, body) = handler(&seen);
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&body).await.is_err() {
            return;
        }
    }
}

fn version_body(api: &str) -> Vec<u8> {
    format!(r#"{{"Version":"99.0.0","ApiVersion":"{api}","MinAPIVersion":"1.24","Os":"linux","Arch":"amd64"}}"#)
        .into_bytes()
}

#[tokio::test]
async fn a_newer_engine_is_spoken_to_at_the_newest_version_this_client_knows() {
    let engine = FakeEngine::start(
        "newer",
        Arc::new(|req: &Seen| match req.path.as_str() {
            "/version" | "/v1.43/version" => (200, "application/json", version_body("1.53")),
            p if p.starts_with("/v1.43/containers/json") => (200, "application/json", b"[]".to_vec()),
            _ => (400, "application/json", br#"{"message":"unexpected path"}"#.to_vec()),
        }),
    );
    let d = engine.docker();
    let listed = d
        .list(&[("gantry.kind".into(), "pod".into()), ("gantry.id".into(), "p 1".into())])
        .await
        .unwrap();
    assert!(listed.is_empty());
    assert_eq!(d.api_version().as_deref(), Some("1.43"));
    assert_eq!(
        d.negotiate().await.unwrap().api_version,
        "1.53",
        "the engine's own version is reported"
    );
    let paths = engine.paths();
    assert_eq!(paths[0], "/version", "negotiation is unversioned");
    assert_eq!(
        paths[1],
        "/v1.43/containers/json?all=1&filters=%7B%22label%22%3A%5B%22gantry.kind%3Dpod%22%2C%22gantry.id%3Dp%201%22%5D%7D"
    );
    assert_eq!(paths.len(), 2, "negotiation happens once: {paths:?}");
}

#[tokio::test]
async fn a_pull_failing_mid_stream_is_a_pull_error_and_carries_the_credentials() {
    let engine = FakeEngine::start(
        "pull",
        Arc::new(|req: &Seen| {
            match req.path.as_str() {
            "/version" => (200, "application/json", version_body("1.41")),
            p if p.starts_with("/v1.41/images/") && p.ends_with("/json") => {
                (404, "application/json", br#"{"message":"No such image"}"#.to_vec())
            }
            p if p.starts_with("/v1.41/images/create") => (
                200,
                "application/json",
                b"{\"status\":\"Pulling from acme/worker\",\"id\":\"1\"}\r\n{\"status\":\"Downloading\",\"progressDetail\":{\"current\":1}}\r\n{\"errorDetail\":{\"message\":\"unauthorized: bad token\"},\"error\":\"unauthorized: bad token\"}\r\n"
                    .to_vec(),
            ),
            _ => (400, "application/json", br#"{"message":"unexpected path"}"#.to_vec()),
        }
        }),
    );
    let d = engine.docker();
    let auth = RegistryAuth {
        username: "acme".into(),
        password: "s3cret".into(),
        server: "registry.example:5000".into(),
    };
    match d.ensure_image("registry.example:5000/acme/worker:2", Some(&auth)).await {
        Err(RuntimeError::Pull(m)) => assert_eq!(m, "registry.example:5000/acme/worker:2: unauthorized: bad token"),
        other => panic!("expected a pull error, got {other:?}"),
    }
    let seen = engine.seen.lock().unwrap().clone();
    let pull = seen.iter().find(|s| s.path.contains("/images/create")).expect("a pull");
    assert_eq!(pull.method, "POST");
    assert_eq!(
        pull.path,
        "/v1.41/images/create?fromImage=registry.example%3A5000%2Facme%2Fworker&tag=2"
    );
    let header = &pull
        .headers
        .iter()
        .find(|(k, _)| k == "x-registry-auth")
        .expect("X-Registry-Auth")
        .1;
    let decoded: serde_json::Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE.decode(header).unwrap()).unwrap();
    assert_eq!(
        decoded,
        serde_json::json!({"username": "acme", "password": "s3cret", "serveraddress": "registry.example:5000"})
    );
}

#[tokio::test]
async fn a_clean_pull_succeeds_and_a_present_image_is_not_pulled() {
    let engine = FakeEngine::start(
        "pull-ok",
        Arc::new(|req: &Seen| match req.path.as_str() {
            "/version" => (200, "application/json", version_body("1.41")),
            "/v1.41/images/busybox/json" => (404, "application/json", br#"{"message":"No such image"}"#.to_vec()),
            "/v1.41/images/present:1/json" => (200, "application/json", b"{}".to_vec()),
            "/v1.41/images/create?fromImage=busybox&tag=latest" => (
                200,
                "application/json",
                b"{\"status\":\"Status: Downloaded newer image\"}\r\n".to_vec(),
            ),
            _ => (400, "application/json", br#"{"message":"unexpected path"}"#.to_vec()),
        }),
    );
    let d = engine.docker();
    d.ensure_image("busybox", None).await.unwrap();
    d.ensure_image("present:1", None).await.unwrap();
    assert_eq!(
        engine.paths().iter().filter(|p| p.contains("/images/create")).count(),
        1
    );
}

#[tokio::test]
async fn the_multiplexed_content_type_is_honoured_and_errors_keep_the_engine_message() {
    let mut framed = Vec::new();
    for (stream, text) in [(1u8, "2024-05-01T10:00:00Z out\n"), (2, "2024-05-01T10:00:01Z err\n")] {
        framed.extend([stream, 0, 0, 0]);
        framed.extend((text.len() as u32).to_be_bytes());
        framed.extend(text.as_bytes());
    }
    let engine = FakeEngine::start(
        "mux",
        Arc::new(move |req: &Seen| match req.path.as_str() {
            "/version" => (200, "application/json", version_body("1.43")),
            p if p.starts_with("/v1.43/containers/c1/logs") => {
                (200, "application/vnd.docker.multiplexed-stream", framed.clone())
            }
            p if p.starts_with("/v1.43/containers/c1/start") => (
                500,
                "application/json",
                br#"{"message":"OCI runtime create failed"}"#.to_vec(),
            ),
            _ => (400, "text/plain", b"bad request\n".to_vec()),
        }),
    );
    let d = engine.docker();
    let lines = d.logs("c1", Some(10), Some(5)).await.unwrap();
    let got: Vec<_> = lines
        .iter()
        .map(|l| (l.stream, l.ts_unix_nanos, l.line.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (LogStream::Stdout, 1_714_557_600_000_000_000, "out"),
            (LogStream::Stderr, 1_714_557_601_000_000_000, "err")
        ]
    );
    assert!(engine.paths()[1].ends_with("?stdout=1&stderr=1&timestamps=1&tail=10&since=5"));
    match d.start("c1").await {
        Err(RuntimeError::Engine { status, message }) => {
            assert_eq!((status, message.as_str()), (500, "OCI runtime create failed"))
        }
        other => panic!("unexpected {other:?}"),
    }
    match d.start("other").await {
        Err(RuntimeError::Engine { status, message }) => assert_eq!((status, message.as_str()), (400, "bad request")),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn an_unparsable_version_is_a_protocol_error() {
    let engine = FakeEngine::start(
        "garbage",
        Arc::new(|_: &Seen| {
            (
                200,
                "application/json",
                br#"{"Version":"x","ApiVersion":"latest"}"#.to_vec(),
            )
        }),
    );
    assert!(matches!(
        engine.docker().negotiate().await,
        Err(RuntimeError::Protocol(_))
    ));
    let engine = FakeEngine::start("html", Arc::new(|_: &Seen| (200, "text/html", b"<html>".to_vec())));
    assert!(matches!(
        engine.docker().negotiate().await,
        Err(RuntimeError::Protocol(_))
    ));
}

#[tokio::test]
async fn tcp_endpoints_work_too() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(|_: &Seen| (200, "application/json", version_body("1.41")));
    let log = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn, Arc::clone(&handler), Arc::clone(&log)));
        }
    });
    let d = Docker::connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    assert_eq!(d.info().await.unwrap().version, "99.0.0");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(),
        ["/version", "/v1.41/version"]
    );
    let host = &seen[0].headers.iter().find(|(k, _)| k == "host").unwrap().1;
    assert_eq!(host, &format!("127.0.0.1:{port}"));
    task.abort();
}
