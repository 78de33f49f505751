use std::time::{Duration, Instant};

use gantry_auth::ScopeSet;
use reqwest::Method;
use serde_json::json;

use crate::harness::{Backend, TestApp, problem};

gantry_testkit::on_both_backends!(
    every_kind_of_bad_credential_is_a_distinct_401,
    scopes_decide_what_a_valid_key_may_do,
    an_expired_key_stops_working,
    a_key_revoked_by_another_process_stops_working_once_its_cache_entry_ends,
);

async fn unauthorized(app: &TestApp, header: Option<&str>) -> String {
    let mut request = app.request(Method::GET, "/v2/network-volumes", None);
    if let Some(header) = header {
        request = request.header("authorization", header);
    }
    let res = request.send().await.unwrap();
    assert_eq!(
        res.headers().get("www-authenticate").and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    let body = problem(res, 401).await;
    assert_eq!(body["title"], "Unauthorized");
    body["detail"].as_str().unwrap().to_string()
}

async fn every_kind_of_bad_credential_is_a_distinct_401(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let mut typo = key.clone().into_bytes();
    typo[12] = if typo[12] == b'x' { b'y' } else { b'x' };
    let typo = String::from_utf8(typo).unwrap();
    // Well-formed, right checksum, but never issued here.
    let stranger = gantry_auth::ApiKey::generate();
    let (revoked_email, revoked) = app.user_with_key("all").await;
    let revoked_user = app.auth.find_user(&revoked_email).await.unwrap();
    let revoked_id = app.auth.list_keys(&revoked_user).await.unwrap()[0].id.clone();
    app.auth.revoke_key(&revoked_id).await.unwrap();

    let details = [
        unauthorized(&app, None).await,
        unauthorized(&app, Some(&format!("Basic {key}"))).await,
        unauthorized(&app, Some("Bearer")).await,
        unauthorized(&app, Some("Bearer gk_not-a-key")).await,
        unauthorized(&app, Some(&format!("Bearer {typo}"))).await,
        unauthorized(&app, Some(&format!("Bearer {}", stranger.expose()))).await,
        unauthorized(&app, Some(&format!("Bearer {revoked}"))).await,
    ];
    assert_eq!(
        details,
        [
            "missing bearer token",
            "the Authorization header must be 'Bearer <api key>'",
            "the Authorization header must be 'Bearer <api key>'",
            "malformed API key",
            "API key checksum mismatch (mistyped key?)",
            "API key is not recognised",
            "API key has been revoked",
        ]
    );
    // The good key still works, with either capitalisation of the scheme.
    let ok = app
        .request(Method::GET, "/v2/network-volumes", None)
        .header("authorization", format!("bearer {key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

async fn scopes_decide_what_a_valid_key_may_do(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, writer) = app.user_with_key("all").await;
    let created = app
        .send_json(
            Method::POST,
            "/v2/network-volumes",
            &writer,
            &json!({"name": "v", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await;
    assert_eq!(created.status(), 201);

    let (_, read_only) = app.user_with_key("read-only").await;
    assert_eq!(app.get("/v2/network-volumes", &read_only).await.status(), 200);
    assert_eq!(app.get("/v2/catalog/datacenters", &read_only).await.status(), 200);
    let denied = app
        .send_json(
            Method::POST,
            "/v2/network-volumes",
            &read_only,
            &json!({"name": "v", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await;
    let body = problem(denied, 403).await;
    assert_eq!(body["title"], "Forbidden");
    assert_eq!(body["detail"], "this API key lacks the 'volumes:write' scope");
    problem(
        app.send_json(Method::PATCH, "/v2/network-volumes/x", &read_only, &json!({"size": 10}))
            .await,
        403,
    )
    .await;
    problem(
        app.request(Method::DELETE, "/v2/network-volumes/x", Some(&read_only))
            .send()
            .await
            .unwrap(),
        403,
    )
    .await;

    // Scope is checked before the body: an invalid body from an unauthorised key is still 403.
    let (_, runner) = app.user_with_key("endpoints:run").await;
    let body = problem(app.get("/v2/network-volumes", &runner).await, 403).await;
    assert_eq!(body["detail"], "this API key lacks the 'volumes:read' scope");
    problem(app.get("/v2/catalog/datacenters", &runner).await, 403).await;
    problem(
        app.send_json(Method::POST, "/v2/network-volumes", &runner, &json!({"bogus": 1}))
            .await,
        403,
    )
    .await;

    let (_, write_only) = app.user_with_key("volumes:write").await;
    let res = app
        .send_json(
            Method::POST,
            "/v2/network-volumes",
            &write_only,
            &json!({"name": "w", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await;
    assert_eq!(res.status(), 201);
    problem(app.get("/v2/network-volumes", &write_only).await, 403).await;
}

async fn an_expired_key_stops_working(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let user = app.auth.create_user("expiring@example.test").await.unwrap();
    let issued = app
        .auth
        .issue_key(&user, ScopeSet::all(), Some(Duration::from_secs(2)), None)
        .await
        .unwrap();
    let key = issued.key.expose().to_string();
    assert_eq!(
        app.get("/v2/network-volumes", &key).await.status(),
        200,
        "valid before expiry (and now cached)"
    );
    // Expiry is stored in whole seconds: a 2 s key stays valid for at least 1 s after issue.
    let expires_at = issued.info.expires_at.unwrap();
    while gantry_auth::unix_now() <= expires_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = problem(app.get("/v2/network-volumes", &key).await, 401).await;
    assert_eq!(
        body["detail"], "API key has expired",
        "expiry is enforced even for a cached key"
    );
}

async fn a_key_revoked_by_another_process_stops_working_once_its_cache_entry_ends(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (email, key) = app.user_with_key("all").await;
    assert_eq!(
        app.get("/v2/network-volumes", &key).await.status(),
        200,
        "the key is now cached"
    );
    // The cache entry was made before now, so it is gone by then + TTL: no
    // request sent after that may pass, however slowly the machine gets there.
    let cached_until = Instant::now() + Duration::from_millis(app.settings.auth.cache_ttl_ms);
    let user = app.auth.find_user(&email).await.unwrap();
    let key_id = app.auth.list_keys(&user).await.unwrap()[0].id.clone();

    let output = crate::cli::gantry(&app, &["keys", "revoke", &key_id]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    loop {
        let sent = Instant::now();
        let status = app.get("/v2/network-volumes", &key).await.status();
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            sent < cached_until,
            "a revoked key was accepted after its cache entry (TTL {} ms) ended",
            app.settings.auth.cache_ttl_ms
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = problem(app.get("/v2/network-volumes", &key).await, 401).await;
    assert_eq!(body["detail"], "API key has been revoked");
}
