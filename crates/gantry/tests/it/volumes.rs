use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    lifecycle_create_list_rename_grow_delete,
    omitted_type_takes_the_data_centers_default_tier,
    create_reports_every_validation_failure_and_writes_nothing,
    create_rejects_each_rule_on_its_own,
    update_rules,
    another_users_volume_is_indistinguishable_from_a_missing_one,
    concurrent_resizes_never_shrink_a_volume,
    names_have_one_rule_on_every_backend,
);

async fn create(app: &TestApp, key: &str, body: Value) -> Value {
    let res = app.send_json(Method::POST, "/v2/network-volumes", key, &body).await;
    assert_eq!(res.status(), 201, "create {body}");
    res.json().await.unwrap()
}

async fn list(app: &TestApp, key: &str) -> Vec<Value> {
    let res = app.get("/v2/network-volumes", key).await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    body["networkVolumes"]
        .as_array()
        .cloned()
        .expect("networkVolumes array")
}

async fn lifecycle_create_list_rename_grow_delete(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    assert!(list(&app, &key).await.is_empty());

    let created = create(
        &app,
        &key,
        json!({"name": "training-data", "size": 50, "dataCenter": "EU-RO-1", "type": "HIGH_PERFORMANCE"}),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 10);
    assert_eq!(
        created,
        json!({"id": id, "name": "training-data", "size": 50, "dataCenter": "EU-RO-1", "type": "HIGH_PERFORMANCE"})
    );
    assert_eq!(list(&app, &key).await, vec![created.clone()]);

    let path = format!("/v2/network-volumes/{id}");
    let got: Value = app.get(&path, &key).await.json().await.unwrap();
    assert_eq!(got, created);

    let renamed = app
        .send_json(Method::PATCH, &path, &key, &json!({"name": "renamed"}))
        .await;
    assert_eq!(renamed.status(), 200);
    let renamed: Value = renamed.json().await.unwrap();
    assert_eq!(
        (renamed["name"].as_str(), renamed["size"].as_u64()),
        (Some("renamed"), Some(50))
    );

    let grown = app.send_json(Method::PATCH, &path, &key, &json!({"size": 200})).await;
    assert_eq!(grown.status(), 200);
    let grown: Value = grown.json().await.unwrap();
    assert_eq!(
        grown,
        json!({"id": id, "name": "renamed", "size": 200, "dataCenter": "EU-RO-1", "type": "HIGH_PERFORMANCE"})
    );
    assert_eq!(app.get(&path, &key).await.json::<Value>().await.unwrap(), grown);
    assert_eq!(
        list(&app, &key).await,
        vec![grown.clone()],
        "the list shows the new size at once"
    );
    let rejected = app
        .send_json(Method::PATCH, &path, &key, &json!({"name": "nope", "size": 20}))
        .await;
    assert_eq!(rejected.status(), 400);
    assert_eq!(
        list(&app, &key).await,
        vec![grown.clone()],
        "a rejected update changes nothing"
    );

    let deleted = app.request(Method::DELETE, &path, Some(&key)).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(deleted.bytes().await.unwrap().is_empty(), "204 has no body");
    let gone = problem(app.get(&path, &key).await, 404).await;
    assert_eq!(gone["detail"], "network volume not found");
    let again = app.request(Method::DELETE, &path, Some(&key)).send().await.unwrap();
    problem(again, 404).await;
    assert!(list(&app, &key).await.is_empty());
}

async fn omitted_type_takes_the_data_centers_default_tier(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("volumes:read,volumes:write").await;
    // US-KS-2 lists HIGH_PERFORMANCE first; EU-RO-1 lists STANDARD first.
    let ks = create(&app, &key, json!({"name": "a", "size": 10, "dataCenter": "US-KS-2"})).await;
    assert_eq!(ks["type"], "HIGH_PERFORMANCE");
    let ro = create(&app, &key, json!({"name": "b", "size": 4096, "dataCenter": "EU-RO-1"})).await;
    assert_eq!(ro["type"], "STANDARD");
    let names: Vec<Value> = list(&app, &key).await.iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, vec![json!("a"), json!("b")], "listed in creation order");
}

async fn create_reports_every_validation_failure_and_writes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let body = json!({"name": "", "size": 5, "dataCenter": "NOPE-1", "type": "FAST", "bogus": 1});
    let res = app.send_json(Method::POST, "/v2/network-volumes", &key, &body).await;
    let body = problem(res, 422).await;
    assert_eq!(body["title"], "Unprocessable Entity");
    let errors = errors_of(&body);
    for expected in [
        "$.bogus: unknown property",
        "$.name: must not be empty",
        "$.size: must be at least 10",
        "$.type: must be one of STANDARD, HIGH_PERFORMANCE (got 'FAST')",
    ] {
        assert!(
            errors.contains(&expected.to_string()),
            "missing {expected:?} in {errors:?}"
        );
    }
    assert_eq!(errors.len(), 4, "{errors:?}");

    let res = app
        .send_json(Method::POST, "/v2/network-volumes", &key, &json!({}))
        .await;
    let errors = errors_of(&problem(res, 422).await);
    assert_eq!(
        errors,
        vec![
            "$.name: required property is missing",
            "$.size: required property is missing",
            "$.dataCenter: required property is missing"
        ]
    );
    assert!(list(&app, &key).await.is_empty(), "bad input changes nothing");
}

async fn create_rejects_each_rule_on_its_own(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let valid = json!({"name": "n", "size": 20, "dataCenter": "EU-RO-1"});
    let cases: Vec<(&str, Value, &str)> = vec![
        ("size", json!(9), "$.size: must be at least 10"),
        ("size", json!(4097), "$.size: must be at most 4096"),
        (
            "size",
            json!(10.5),
            "$.size: must be an integer, not a fractional number",
        ),
        ("size", json!("50"), "$.size: must be an integer, not a string"),
        ("size", json!(u64::MAX), "$.size: must be at most 4096"),
        ("name", json!(""), "$.name: must not be empty"),
        ("name", json!(42), "$.name: must be a string, not a number"),
        ("name", Value::Null, "$.name: must be a string, not null"),
        ("dataCenter", json!(""), "$.dataCenter: must not be empty"),
        (
            "dataCenter",
            json!("MARS-1"),
            "$.dataCenter: unknown data center 'MARS-1'",
        ),
        (
            "dataCenter",
            json!("EU-CZ-1"),
            "$.dataCenter: data center 'EU-CZ-1' does not offer network volumes",
        ),
        (
            "type",
            json!("standard"),
            "$.type: must be one of STANDARD, HIGH_PERFORMANCE (got 'standard')",
        ),
        ("extra", json!(true), "$.extra: unknown property"),
    ];
    for (field, value, expected) in cases {
        let mut body = valid.clone();
        body[field] = value;
        let res = app.send_json(Method::POST, "/v2/network-volumes", &key, &body).await;
        let errors = errors_of(&problem(res, 422).await);
        assert_eq!(errors, vec![expected.to_string()], "for {body}");
    }
    // A tier the data center does not offer.
    let body = json!({"name": "n", "size": 20, "dataCenter": "US-TX-3", "type": "HIGH_PERFORMANCE"});
    let errors = errors_of(
        &problem(
            app.send_json(Method::POST, "/v2/network-volumes", &key, &body).await,
            422,
        )
        .await,
    );
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("$.type: HIGH_PERFORMANCE: tier not offered"),
        "{errors:?}"
    );
    // The body must be an object.
    let res = app
        .send_json(Method::POST, "/v2/network-volumes", &key, &json!([valid]))
        .await;
    assert_eq!(
        errors_of(&problem(res, 422).await),
        vec!["$: must be a JSON object, not an array"]
    );
    assert!(list(&app, &key).await.is_empty());
    // The boundaries themselves are valid.
    create(
        &app,
        &key,
        json!({"name": " ", "size": 10, "dataCenter": "EU-RO-1", "type": "STANDARD"}),
    )
    .await;
}

async fn update_rules(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let created = create(
        &app,
        &key,
        json!({"name": "keep", "size": 100, "dataCenter": "US-KS-2"}),
    )
    .await;
    let path = format!("/v2/network-volumes/{}", created["id"].as_str().unwrap());

    let cases: Vec<(Value, u16, Vec<&str>)> = vec![
        (json!({}), 422, vec!["$: at least one of name, size is required"]),
        (
            json!({"dataCenter": "EU-RO-1"}),
            422,
            vec![
                "$.dataCenter: unknown property",
                "$: at least one of name, size is required",
            ],
        ),
        (
            json!({"type": "STANDARD", "name": "x"}),
            422,
            vec!["$.type: unknown property"],
        ),
        (json!({"name": ""}), 422, vec!["$.name: must not be empty"]),
        (json!({"size": 5000}), 422, vec!["$.size: must be at most 4096"]),
        (
            json!({"size": 50}),
            400,
            vec!["$.size: must not be smaller than the current size (100)"],
        ),
        (
            json!({"name": "changed", "size": 99}),
            400,
            vec!["$.size: must not be smaller than the current size (100)"],
        ),
    ];
    for (body, status, expected) in cases {
        let res = app.send_json(Method::PATCH, &path, &key, &body).await;
        let answer = problem(res, status).await;
        assert_eq!(errors_of(&answer), expected, "for {body}");
    }
    let after: Value = app.get(&path, &key).await.json().await.unwrap();
    assert_eq!(after, created, "rejected updates change nothing");

    let same = app.send_json(Method::PATCH, &path, &key, &json!({"size": 100})).await;
    assert_eq!(same.status(), 200, "the same size is allowed");
    let missing = app
        .send_json(Method::PATCH, "/v2/network-volumes/nope", &key, &json!({"name": "x"}))
        .await;
    problem(missing, 404).await;
}

async fn another_users_volume_is_indistinguishable_from_a_missing_one(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, alice) = app.user_with_key("all").await;
    let (_, bob) = app.user_with_key("all").await;
    let volume = create(
        &app,
        &alice,
        json!({"name": "alice's", "size": 10, "dataCenter": "EU-RO-1"}),
    )
    .await;
    let path = format!("/v2/network-volumes/{}", volume["id"].as_str().unwrap());

    assert!(list(&app, &bob).await.is_empty(), "bob lists only his own");
    let theirs = problem(app.get(&path, &bob).await, 404).await;
    let missing = problem(app.get("/v2/network-volumes/zzzzzzzzzz", &bob).await, 404).await;
    assert_eq!(theirs, missing, "same answer as for a volume that does not exist");
    assert_eq!(theirs["title"], "Not Found");
    problem(
        app.send_json(Method::PATCH, &path, &bob, &json!({"size": 20})).await,
        404,
    )
    .await;
    problem(
        app.request(Method::DELETE, &path, Some(&bob)).send().await.unwrap(),
        404,
    )
    .await;
    assert_eq!(
        app.get(&path, &alice).await.json::<Value>().await.unwrap(),
        volume,
        "untouched"
    );
}

async fn concurrent_resizes_never_shrink_a_volume(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("all").await;
    let volume = create(&app, &key, json!({"name": "v", "size": 10, "dataCenter": "EU-RO-1"})).await;
    let path = format!("/v2/network-volumes/{}", volume["id"].as_str().unwrap());
    let sizes: Vec<u64> = (11..=40).rev().chain(11..=40).collect();
    let tasks = sizes.iter().map(|size| {
        let (app, path, key) = (&app, &path, &key);
        async move {
            let res = app.send_json(Method::PATCH, path, key, &json!({"size": size})).await;
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap();
            (*size, status, body)
        }
    });
    for (size, status, body) in futures_util::future::join_all(tasks).await {
        match status {
            200 => assert_eq!(body["size"], size, "an accepted resize reports its own size"),
            400 => assert!(errors_of(&body)[0].starts_with("$.size: must not be smaller")),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let last: Value = app.get(&path, &key).await.json().await.unwrap();
    assert_eq!(last["size"], 40, "the largest request always wins");
}

/// A NUL (which PostgreSQL's text cannot hold), other control characters,
/// bidirectional overrides and over-long names are a 422 naming the field on
/// both backends, on create and on rename, and nothing is written.
async fn names_have_one_rule_on_every_backend(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("volumes:read,volumes:write").await;
    for bad in ["nul\u{0}name", "tab\tname", "\u{202E}txt.exe", &"n".repeat(129)] {
        let res = app
            .send_json(
                Method::POST,
                "/v2/network-volumes",
                &key,
                &json!({"name": bad, "size": 10, "dataCenter": "EU-RO-1"}),
            )
            .await;
        let body = problem(res, 422).await;
        assert!(errors_of(&body).iter().any(|e| e.starts_with("$.name")), "{body}");
    }
    assert!(list(&app, &key).await.is_empty(), "nothing was written");
    let longest = "n".repeat(128);
    let volume = create(
        &app,
        &key,
        json!({"name": longest, "size": 10, "dataCenter": "EU-RO-1"}),
    )
    .await;
    let path = format!("/v2/network-volumes/{}", volume["id"].as_str().unwrap());
    let res = app
        .send_json(Method::PATCH, &path, &key, &json!({"name": "a\u{0}b"}))
        .await;
    problem(res, 422).await;
    assert_eq!(list(&app, &key).await[0]["name"], longest.as_str());
}
