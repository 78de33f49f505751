use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    malformed_bodies_are_problems_and_change_nothing,
    unknown_routes_and_wrong_methods,
    internal_errors_disclose_nothing,
);

async fn malformed_bodies_are_problems_and_change_nothing(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.http.body_limit_bytes = 1024).await;
    let (_, key) = app.user_with_key("all").await;
    let post = || app.request(Method::POST, "/v2/network-volumes", Some(&key));

    let res = post()
        .header("content-type", "application/json")
        .body("{\"name\": ")
        .send()
        .await
        .unwrap();
    let body = problem(res, 400).await;
    assert_eq!(body["title"], "Bad Request");
    assert_eq!(body["detail"], "request body is not valid JSON");
    assert!(errors_of(&body)[0].starts_with("$: EOF while parsing"), "{body}");

    let res = post()
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    let body = problem(res, 415).await;
    assert_eq!(
        body["detail"],
        "request body must be application/json (Content-Type was 'text/plain')"
    );
    problem(post().body("{}").send().await.unwrap(), 415).await;

    let res = post().header("content-type", "application/json").send().await.unwrap();
    problem(res, 400).await;

    let big = json!({"name": "x".repeat(2000), "size": 10, "dataCenter": "EU-RO-1"});
    let body = problem(post().json(&big).send().await.unwrap(), 413).await;
    assert_eq!(body["detail"], "request body exceeds the limit of 1024 bytes");
    // Chunked, so the limit is enforced while reading and not only from Content-Length.
    let stream = futures_util::stream::iter((0..64).map(|_| Ok::<_, std::io::Error>(vec![b' '; 100])));
    let res = post()
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    problem(res, 413).await;

    // A JSON media type with parameters or a +json suffix is accepted.
    let ok = post()
        .header("content-type", "application/merge-patch+json; charset=utf-8")
        .body(json!({"name": "ok", "size": 10, "dataCenter": "EU-RO-1"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
    let list: serde_json::Value = app.get("/v2/network-volumes", &key).await.json().await.unwrap();
    assert_eq!(
        list["networkVolumes"].as_array().map(Vec::len),
        Some(1),
        "only the valid request wrote"
    );
}

async fn unknown_routes_and_wrong_methods(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let body = problem(app.get("/v2/nothing-here", &key).await, 404).await;
    assert_eq!(body["detail"], "no route for GET /v2/nothing-here");
    problem(
        app.client
            .get(format!("{}/v2/nothing-here", app.public_base))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;

    let res = app
        .request(Method::PUT, "/v2/network-volumes", Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers().get("allow").and_then(|v| v.to_str().ok()),
        Some("GET, POST")
    );
    let body = problem(res, 405).await;
    assert_eq!(body["title"], "Method Not Allowed");
    let res = app
        .request(Method::POST, "/v2/network-volumes/abc", Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers().get("allow").and_then(|v| v.to_str().ok()),
        Some("GET, PATCH, DELETE")
    );
    problem(res, 405).await;
    let res = app
        .request(Method::DELETE, "/v2/catalog/datacenters", Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"));
    problem(res, 405).await;
}

async fn internal_errors_disclose_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    assert_eq!(app.get("/v2/catalog/datacenters", &key).await.status(), 200);
    // Break the storage behind the service's back.
    app.sql("DROP TABLE network_volumes").await;
    let res = app.get("/v2/network-volumes", &key).await;
    let body = problem(res, 500).await;
    assert_eq!(body["title"], "Internal Server Error");
    assert_eq!(body["detail"], "internal server error");
    let text = body.to_string().to_lowercase();
    assert!(
        !text.contains("network_volumes") && !text.contains("table") && !text.contains("sql"),
        "{text}"
    );
    // The rest of the platform keeps answering.
    assert_eq!(app.get("/v2/catalog/datacenters", &key).await.status(), 200);
}

/// A client with a valid key that declares a body and stalls gets a 408
/// problem after `http.body_timeout_ms`, and the connection is closed, on
/// both listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_a_408_problem() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.http.body_timeout_ms = 300).await;
    let (_, key) = app.user_with_key("all").await;
    for (base, path) in [
        (&app.base, "/v2/network-volumes"),
        (&app.public_base, "/v2/gantry-echo/run"),
    ] {
        let addr = base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\": "
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let started = std::time::Instant::now();
        let mut answer = Vec::new();
        // The server answers and closes: read to the end.
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("answered and closed within 10 s")
            .unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{text}"
        );
        assert!(text.contains("\"status\":408"), "{text}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}

/// What the server answers to `request` sent raw on a new connection, read
/// until it closes.
async fn raw_exchange(base: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed within 10 s");
    match read {
        Ok(_) => {}
        // The server closes with part of an oversized request unread, so its
        // TCP stack resets the connection after the answer.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !answer.is_empty() => {}
        Err(e) => panic!("{e} after {} bytes sent, {} read", request.len(), answer.len()),
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// The answer's status and its problem document (which must be one).
fn raw_problem(answer: &str) -> (u16, Value) {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer:?}"));
    let status = head[9..12].parse().unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{answer}"
    );
    let problem: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(problem["status"], status, "{answer}");
    for member in ["title", "detail"] {
        assert!(problem[member].as_str().is_some_and(|t| !t.is_empty()), "{answer}");
    }
    assert!(problem["errors"].is_array(), "{answer}");
    (status, problem)
}

/// The errors HTTP itself answers before any route runs (a request that is not
/// HTTP, a head too large, a head that never arrives) are problems too, on
/// both listeners; and a well-formed request on a fresh connection after them
/// is served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_are_problems() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.http.head_timeout_ms = 1000).await;
    for base in [&app.base, &app.public_base] {
        let host = base.trim_start_matches("http://");
        let (status, _) = raw_problem(&raw_exchange(base, b"NOT AN HTTP REQUEST\r\n\r\n").await);
        assert_eq!(status, 400);
        let bad_header = format!("GET /v2/openapi.json HTTP/1.1\r\nHost: {host}\r\nno colon here\r\n\r\n");
        let (status, _) = raw_problem(&raw_exchange(base, bad_header.as_bytes()).await);
        assert_eq!(status, 400);

        let mut many = format!("GET /v2/openapi.json HTTP/1.1\r\nHost: {host}\r\n");
        for i in 0..120 {
            many.push_str(&format!("X-Filler-{i}: {i}\r\n"));
        }
        many.push_str("\r\n");
        let (status, problem) = raw_problem(&raw_exchange(base, many.as_bytes()).await);
        assert_eq!(status, 431);
        assert_eq!(problem["title"], "Request Header Fields Too Large");
        let long_path = format!("GET /{} HTTP/1.1\r\nHost: {host}\r\n\r\n", "a".repeat(140 * 1024));
        assert_eq!(raw_problem(&raw_exchange(base, long_path.as_bytes()).await).0, 431);

        let started = std::time::Instant::now();
        let (status, _) = raw_problem(&raw_exchange(base, b"GET /v2/openapi.json HTTP/1.1\r\n").await);
        assert_eq!(status, 408);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));

        let fine = format!("GET /v2/openapi.json HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw_exchange(base, fine.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
