use reqwest::Method;
use serde_json::json;

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
