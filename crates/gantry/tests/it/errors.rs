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
