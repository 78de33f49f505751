//! The web console over HTTP, as a browser talks to it: sign-in, the
//! session cookie, CSRF, escaping, keys, volumes, the playground's job path,
//! the operator's actions and the sign-in throttle. (`browser.rs` drives the
//! same flows in headless Chromium.)
use gantry_auth::Role;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use reqwest::{Client, Method, Response};
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    pages_need_a_session_and_sign_in_sets_a_strict_http_only_cookie,
    the_console_api_needs_the_session_and_its_csrf_token_and_escapes_what_users_typed,
    keys_made_in_the_console_work_with_the_api_and_are_shown_once,
    signing_out_everywhere_ends_every_session,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_attempts_are_throttled_per_account() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.console.sign_in_per_minute = 3).await;
    let browser = Browser::new(&app);
    let email = user_with_password(&app, "correct horse battery", Role::User).await;
    for _ in 0..3 {
        let res = browser.sign_in(&email, "wrong password!!").await;
        assert_eq!(res.status(), 401);
    }
    // Over the limit, even the right password is refused until the window passes.
    let res = browser.sign_in(&email, "correct horse battery").await;
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("retry-after").is_some());
    assert!(session_cookie(res.headers()).is_none());
    let body = res.text().await.unwrap();
    assert!(body.contains("Too many sign-in attempts"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_attempts_are_throttled_per_address() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.console.sign_in_per_minute = 3).await;
    let browser = Browser::new(&app);
    let email = user_with_password(&app, "correct horse battery", Role::User).await;
    // Three guesses at three other accounts from one address...
    for i in 0..3 {
        let res = browser
            .sign_in(&format!("guess{i}@example.test"), "not the password")
            .await;
        assert_eq!(res.status(), 401);
    }
    // ...and that address may try no account, this one's first attempt included.
    let res = browser.sign_in(&email, "correct horse battery").await;
    assert_eq!(res.status(), 429);
    assert!(session_cookie(res.headers()).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_pages_and_actions_need_the_admin_role() {
    let mut app = TestApp::spawn(Backend::Sqlite).await;
    // The top-up below is the user's first credit.
    app.starting_credit_micro_usd = 0;
    let user = Browser::signed_in(&app, Role::User).await;
    let res = user.get("/console/admin").await;
    assert_eq!(res.status(), 403);
    assert!(res.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let res = user
        .api(
            Method::POST,
            "/console/api/admin/credit",
            json!({"email": user.email, "usd": "5"}),
        )
        .await;
    problem(res, 403).await;
    assert!(!user.get_text("/console").await.contains("Operators"));

    let admin = Browser::signed_in(&app, Role::Admin).await;
    let page = admin.get_text("/console/admin").await;
    assert!(page.contains(&user.email) && page.contains("gantry-echo"), "{page}");
    let res = admin
        .api(
            Method::POST,
            "/console/api/admin/credit",
            json!({"email": user.email, "usd": "abc"}),
        )
        .await;
    let body = problem(res, 422).await;
    assert!(errors_of(&body).iter().any(|e| e.starts_with("usd:")), "{body}");
    let res = admin
        .api(
            Method::POST,
            "/console/api/admin/credit",
            json!({"email": user.email, "usd": "12.5", "reason": "welcome"}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["balanceUsd"], "12.500000");
    assert!(user.get_text("/console").await.contains("$12.50"));
    let res = admin
        .api(
            Method::POST,
            "/console/api/admin/limits",
            json!({"email": user.email, "minute": 7, "hour": null, "day": null, "exempt": false}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.auth.find_user(&user.email).await.unwrap().limits.minute, Some(7));
    let res = admin
        .api(
            Method::POST,
            "/console/api/admin/role",
            json!({"email": admin.email, "role": "user"}),
        )
        .await;
    problem(res, 422).await;
    let res = admin
        .api(
            Method::POST,
            "/console/api/admin/role",
            json!({"email": user.email, "role": "admin"}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(user.get("/console/admin").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_sign_up_is_off_by_default_and_works_when_on() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let browser = Browser::new(&app);
    assert_eq!(browser.get("/console/sign-up").await.status(), 404);
    let res = browser
        .client
        .post(format!("{}/console/sign-up", app.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("email", "new@example.test"),
            ("password", "long enough password"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    assert!(app.auth.find_user("new@example.test").await.is_err());

    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.console.self_signup = true).await;
    let mut browser = Browser::new(&app);
    let res = browser.submit("/console/sign-up", "new@example.test", "short").await;
    assert_eq!(res.status(), 422);
    assert!(app.auth.find_user("new@example.test").await.is_err());
    let res = browser
        .submit("/console/sign-up", "new@example.test", "long enough password")
        .await;
    assert_eq!(res.status(), 303);
    browser.cookie = session_cookie(res.headers());
    assert!(browser.get_text("/console").await.contains("new@example.test"));
    let res = browser
        .submit("/console/sign-up", "new@example.test", "another long password")
        .await;
    assert_eq!(res.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_runs_jobs_as_the_signed_in_user_and_lists_them() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let browser = Browser::signed_in(&app, Role::User).await;
    let page = browser.get_text("/console/playground/gantry-echo").await;
    assert!(page.contains("id=\"playground\""), "{page}");
    // Text and embedding models show the OpenAI SDK's call as well; the others do not.
    assert!(!page.contains("id=\"code-openai\""));
    let embedding = browser.get_text("/console/playground/all-minilm-l6-v2").await;
    assert!(
        embedding.contains("data-kind=\"embedding\"") && embedding.contains("id=\"code-openai\""),
        "{embedding}"
    );
    let res = browser
        .api(
            Method::POST,
            "/console/api/models/v2/gantry-echo/run",
            json!({"input": {"note": "<b>bold</b>", "stream": 3}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    // The public listener's rate limit policy counts these, as for a key.
    assert!(res.headers().get("ratelimit-policy").is_some());
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    // The stream as the page's EventSource reads it: chunks, then the final job.
    let res = browser
        .client
        .get(format!("{}/console/api/models/v2/gantry-echo/stream/{id}", app.base))
        .header("cookie", browser.cookie_header())
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let events = crate::harness::parse_sse(&res.text().await.unwrap());
    assert_eq!(events.iter().filter(|(_, name, _)| name == "chunk").count(), 3);
    let (_, name, last) = events.last().unwrap();
    assert_eq!(name, "status");
    assert_eq!(last["status"], "COMPLETED");

    let jobs = browser.get_text("/console/jobs").await;
    assert!(jobs.contains(&format!("/console/jobs/gantry-echo/{id}")), "{jobs}");
    let job = browser.get_text(&format!("/console/jobs/gantry-echo/{id}")).await;
    assert!(
        job.contains("COMPLETED") && job.contains("&lt;b&gt;bold&lt;/b&gt;"),
        "{job}"
    );
    assert!(!job.contains("<b>bold</b>"));
    // Its charge is in the billing page and both CSV exports.
    assert!(
        browser
            .get_text("/console/billing")
            .await
            .contains("<td>gantry-echo</td><td>model</td>")
    );
    let csv = browser.get_text("/console/billing.csv?by=subject").await;
    assert!(csv.starts_with("bucket_start,kind,subject,usd\n"), "{csv}");
    assert!(csv.lines().any(|l| l.contains(",model,gantry-echo,0.0000")), "{csv}");
    // Another user sees neither the job nor its page.
    let other = Browser::signed_in(&app, Role::User).await;
    assert_eq!(
        other.get(&format!("/console/jobs/gantry-echo/{id}")).await.status(),
        404
    );
    assert!(!other.get_text("/console/jobs").await.contains(&id));
}

/// The pages of a user's own containers, on the private Docker engine: a
/// pod made through the console's API, its page with its status and log
/// (the REST log route through the session), its actions; an endpoint
/// scaled from its row, with the API's validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_and_endpoints_are_run_from_their_pages() {
    let app = crate::serverless::spawn(Backend::Sqlite).await;
    let browser = Browser::signed_in(&app, Role::User).await;
    let res = browser
        .api(
            Method::POST,
            "/console/api/manage/v2/pods",
            json!({"name": "notebook <1>", "image": "gantry-test/busybox:1",
                   "args": "sh -c 'echo line one; echo line two; exec sleep 3600'",
                   "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await;
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let page = browser.get_text(&format!("/console/pods/{id}")).await;
        assert!(page.contains("notebook &lt;1&gt;"), "{page}");
        if page.contains(">RUNNING<") {
            assert!(page.contains(&format!(
                "data-logs=\"/console/api/manage/v2/pods/{id}/logs?follow=true"
            )));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never RUNNING: {page}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        browser
            .get_text("/console/pods")
            .await
            .contains(&format!("href=\"/console/pods/{id}\""))
    );
    // The log as the page's EventSource reads it (here without following).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let logs = browser
            .get(&format!("/console/api/manage/v2/pods/{id}/logs?tail=50"))
            .await;
        assert_eq!(logs.status(), 200);
        let text = logs.text().await.unwrap();
        if text.contains("line two") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no log: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let res = browser
        .api(
            Method::POST,
            &format!("/console/api/manage/v2/pods/{id}/action"),
            json!({"action": "stop"}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let res = browser
        .api(
            Method::DELETE,
            &format!("/console/api/manage/v2/pods/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(res.status(), 204);
    assert_eq!(browser.get(&format!("/console/pods/{id}")).await.status(), 404);
    // Another user's pod page is as missing as a deleted one.
    let other = Browser::signed_in(&app, Role::User).await;
    assert_eq!(other.get(&format!("/console/pods/{id}")).await.status(), 404);

    // An endpoint scaled from its row: the form's fields make `{"workers": {"min", "max"}}`.
    let res = browser
        .api(
            Method::POST,
            "/console/api/manage/v2/serverless",
            json!({"name": "ep", "type": "QUEUE", "image": "gantry-test/busybox:1",
                   "scaling": {"type": "REQUEST_COUNT", "requestCount": 1}, "workers": {"min": 0, "max": 1}}),
        )
        .await;
    assert_eq!(res.status(), 201);
    let endpoint = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let page = browser.get_text("/console/endpoints").await;
    assert!(
        page.contains(&format!("data-api=\"/console/api/manage/v2/serverless/{endpoint}\"")),
        "{page}"
    );
    assert!(page.contains("name=\"workers.max\""));
    let path = format!("/console/api/manage/v2/serverless/{endpoint}");
    let res = browser
        .api(Method::PATCH, &path, json!({"workers": {"min": 3, "max": 1}}))
        .await;
    let body = problem(res, 422).await;
    assert!(errors_of(&body).iter().any(|e| e.contains("workers")), "{body}");
    let res = browser
        .api(Method::PATCH, &path, json!({"workers": {"min": 0, "max": 3}}))
        .await;
    assert_eq!(res.status(), 200);
    assert!(browser.get_text("/console/endpoints").await.contains("value=\"3\""));
    // At least one worker: its container starts, the endpoint's page lists
    // it, and its log is read through the session.
    let res = browser
        .api(
            Method::PATCH,
            &path,
            json!({"workers": {"min": 1, "max": 1}, "args": "sh -c 'echo worker says hi; exec sleep 3600'"}),
        )
        .await;
    assert_eq!(res.status(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let worker = loop {
        let page = browser.get_text(&format!("/console/endpoints/{endpoint}")).await;
        let marker = format!("href=\"/console/endpoints/{endpoint}/workers/");
        if let Some(at) = page.find(&marker) {
            break page[at + marker.len()..].split('"').next().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no worker listed: {page}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let page = browser
        .get_text(&format!("/console/endpoints/{endpoint}/workers/{worker}"))
        .await;
    assert!(page.contains(&format!(
        "data-logs=\"/console/api/manage/v2/serverless/{endpoint}/workers/{worker}/logs"
    )));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let logs = browser
            .get(&format!(
                "/console/api/manage/v2/serverless/{endpoint}/workers/{worker}/logs?tail=50"
            ))
            .await;
        assert_eq!(logs.status(), 200);
        let text = logs.text().await.unwrap();
        if text.contains("worker says hi") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no worker log: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(other.get(&format!("/console/endpoints/{endpoint}")).await.status(), 404);
    let res = browser.api(Method::DELETE, &path, Value::Null).await;
    assert_eq!(res.status(), 204);

    // Templates: each offers the form that starts an endpoint or a pod from it;
    // the bodies below are what those forms send.
    for serverless in [true, false] {
        let res = browser
            .api(
                Method::POST,
                "/console/api/manage/v2/templates",
                json!({"name": format!("t-{serverless}"), "image": "gantry-test/busybox:1",
                       "args": "sleep 3600", "serverless": serverless}),
            )
            .await;
        assert_eq!(res.status(), 201);
    }
    let page = browser.get_text("/console/templates").await;
    let template_of = |kind: &str| {
        let at = page
            .find(&format!("data-api=\"/console/api/manage/v2/{kind}\""))
            .expect(kind);
        let marker = "name=\"templateId\" value=\"";
        let from = at + page[at..].find(marker).unwrap() + marker.len();
        page[from..].split('"').next().unwrap().to_owned()
    };
    let (endpoint_template, pod_template) = (template_of("serverless"), template_of("pods"));
    let res = browser
        .api(
            Method::POST,
            "/console/api/manage/v2/serverless",
            json!({"templateId": endpoint_template, "type": "QUEUE",
                   "scaling": {"type": "REQUEST_COUNT", "requestCount": 1},
                   "name": "from a template", "workers": {"min": 0, "max": 1}}),
        )
        .await;
    assert_eq!(res.status(), 201);
    let res = browser
        .api(
            Method::POST,
            "/console/api/manage/v2/pods",
            json!({"templateId": pod_template, "name": "pod from a template", "cpu": {"id": "cpu3c", "vcpuCount": 2}}),
        )
        .await;
    assert_eq!(res.status(), 201);
    let pod = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    assert!(browser.get_text("/console/endpoints").await.contains("from a template"));
    assert!(browser.get_text("/console/pods").await.contains("pod from a template"));
    let res = browser
        .api(
            Method::DELETE,
            &format!("/console/api/manage/v2/pods/{pod}"),
            Value::Null,
        )
        .await;
    assert_eq!(res.status(), 204);
}

async fn pages_need_a_session_and_sign_in_sets_a_strict_http_only_cookie(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let browser = Browser::new(&app);
    let res = browser.get("/console/keys").await;
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()[LOCATION], "/console/sign-in?next=/console/keys");

    let res = browser.get("/console/sign-in").await;
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"));
    assert_eq!(res.headers()["x-frame-options"], "DENY");
    assert_eq!(res.headers()["cache-control"], "no-store");

    let email = user_with_password(&app, "correct horse battery", Role::User).await;
    // Wrong password and unknown email: the same answer, no session.
    for (who, password) in [
        (email.as_str(), "not the password"),
        ("nobody@example.test", "correct horse battery"),
    ] {
        let res = browser.sign_in(who, password).await;
        assert_eq!(res.status(), 401);
        assert!(session_cookie(res.headers()).is_none());
        assert!(res.text().await.unwrap().contains("Wrong email or password."));
    }
    // A form this server did not render for this browser (login CSRF).
    let res = browser
        .client
        .post(format!("{}/console/sign-in", app.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("email", email.as_str()),
            ("password", "correct horse battery"),
            ("form", "forged"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert!(session_cookie(res.headers()).is_none());

    let res = browser
        .sign_in_to(&email, "correct horse battery", "/console/volumes")
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()[LOCATION], "/console/volumes");
    let set = res
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("gantry_session="))
        .expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=43200"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    // Behind a TLS proxy the cookie is Secure.
    let res = browser
        .client
        .get(format!("{}/console/sign-in", app.base))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    assert!(res.headers()[SET_COOKIE].to_str().unwrap().contains("; Secure"));
    // An open redirect is not on offer.
    let res = browser
        .sign_in_to(&email, "correct horse battery", "//evil.example/")
        .await;
    assert_eq!(res.headers()[LOCATION], "/console");

    let mut browser = browser;
    browser.cookie = session_cookie(res.headers());
    let overview = browser.get_text("/console").await;
    assert!(overview.contains(&email) && overview.contains("Credit"), "{overview}");
    // A job's charge reaches the overview's spend and the billing page (summed
    // per bucket by the database, on either backend).
    let res = browser
        .api(
            Method::POST,
            "/console/api/models/v2/gantry-echo/runsync",
            json!({"input": {}}),
        )
        .await;
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "COMPLETED");
    let overview = browser.get_text("/console").await;
    assert!(overview.contains("id=\"spend\">$0.000010<"), "{overview}");
    let billing = browser.get_text("/console/billing?bucket=hour").await;
    assert!(
        billing.contains("<td>gantry-echo</td><td>model</td><td>$0.000010</td>"),
        "{billing}"
    );
    for path in [
        "/console",
        "/console/keys",
        "/console/volumes",
        "/console/billing",
        "/console/billing?bucket=hour",
        "/console/playground",
        "/console/playground/gantry-echo",
        "/console/jobs",
        "/console/endpoints",
        "/console/pods",
    ] {
        let res = browser.get(path).await;
        assert_eq!(res.status(), 200, "{path}");
        let body = res.bytes().await.unwrap();
        assert!(body.len() < 100 * 1024, "{path}: {} bytes", body.len());
    }
    let csv = browser.get("/console/billing.csv").await;
    assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
    assert!(csv.text().await.unwrap().starts_with("bucket_start,models_usd,"));
    assert_eq!(browser.get("/console/nowhere").await.status(), 404);
}

async fn the_console_api_needs_the_session_and_its_csrf_token_and_escapes_what_users_typed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let browser = Browser::signed_in(&app, Role::User).await;
    let body = json!({"name": "<script>alert(1)</script>", "size": 10, "dataCenter": "EU-RO-1"});
    let url = format!("{}/console/api/manage/v2/network-volumes", app.base);
    // No session: 401, as problem+json.
    let res = browser.client.post(&url).json(&body).send().await.unwrap();
    problem(res, 401).await;
    // A session but no or a wrong CSRF token: 403, and nothing is made.
    let res = browser
        .client
        .post(&url)
        .header("cookie", browser.cookie_header())
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(res, 403).await;
    let res = browser
        .client
        .post(&url)
        .header("cookie", browser.cookie_header())
        .header("x-csrf-token", "0".repeat(64))
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(res, 403).await;
    let listed = browser.get("/console/api/manage/v2/network-volumes").await;
    assert_eq!(listed.json::<Value>().await.unwrap()["networkVolumes"], json!([]));
    // The REST API's own validation and messages.
    let res = browser
        .api(
            Method::POST,
            "/console/api/manage/v2/network-volumes",
            json!({"name": "x", "size": 5}),
        )
        .await;
    let problem_body = problem(res, 422).await;
    let errors = errors_of(&problem_body);
    assert!(errors.iter().any(|e| e.starts_with("$.size:")), "{errors:?}");
    assert!(errors.iter().any(|e| e.starts_with("$.dataCenter:")), "{errors:?}");
    let res = browser
        .api(Method::POST, "/console/api/manage/v2/network-volumes", body)
        .await;
    assert_eq!(res.status(), 201);
    assert!(res.headers().get("ratelimit-policy").is_some());
    let page = browser.get_text("/console/volumes").await;
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
    assert!(!page.contains("<script>alert(1)</script>"));
    // Only the console's own script runs, from its own file.
    assert_eq!(page.matches("<script").count(), 1);
    assert!(page.contains("<script src=\"/console/assets/console.js\" defer></script>"));
}

async fn keys_made_in_the_console_work_with_the_api_and_are_shown_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let browser = Browser::signed_in(&app, Role::User).await;
    let res = browser
        .api(
            Method::POST,
            "/console/api/keys",
            json!({"name": "ci", "scopes": ["volumes:rread"]}),
        )
        .await;
    let body = problem(res, 422).await;
    assert!(
        errors_of(&body)[0].starts_with("scopes: unknown scope 'volumes:rread'"),
        "{body}"
    );
    let res = browser
        .api(Method::POST, "/console/api/keys", json!({"name": "ci", "scopes": []}))
        .await;
    problem(res, 422).await;
    let res = browser
        .api(
            Method::POST,
            "/console/api/keys",
            json!({"name": "ci <laptop>", "scopes": ["volumes:read"], "expiresIn": "30d"}),
        )
        .await;
    assert_eq!(res.status(), 201);
    let issued: Value = res.json().await.unwrap();
    let key = issued["key"].as_str().unwrap().to_owned();
    // The key works with the REST API, within its scopes.
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
    let res = app
        .send_json(
            Method::POST,
            "/v2/network-volumes",
            &key,
            &json!({"name": "a", "size": 10, "dataCenter": "EU-RO-1"}),
        )
        .await;
    problem(res, 403).await;
    // The list shows the prefix and last four, never the key; when it was last used.
    let page = browser.get_text("/console/keys").await;
    assert!(!page.contains(&key));
    assert!(page.contains(&format!("…{}", &key[key.len() - 4..])), "{page}");
    assert!(page.contains("ci &lt;laptop&gt;"));
    let user = app.auth.find_user(&browser.email).await.unwrap();
    let listed = app.auth.list_keys(&user).await.unwrap();
    let used = listed.iter().find(|k| k.id == issued["id"]).unwrap().last_used_at;
    let used = used.expect("the key's use is recorded");
    assert!(page.contains(&format!("<td>{}</td>", &html_time(used))), "{page}");
    // Another user cannot revoke it; its owner can.
    let other = Browser::signed_in(&app, Role::User).await;
    let id = issued["id"].as_str().unwrap();
    let res = other
        .api(Method::DELETE, &format!("/console/api/keys/{id}"), Value::Null)
        .await;
    problem(res, 404).await;
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
    let res = browser
        .api(Method::DELETE, &format!("/console/api/keys/{id}"), Value::Null)
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 401);
    assert!(browser.get_text("/console/keys").await.contains("revoked"));
}

async fn signing_out_everywhere_ends_every_session(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let email = user_with_password(&app, "correct horse battery", Role::User).await;
    let mut first = Browser::new(&app);
    first.sign_in_as(&email, "correct horse battery").await;
    let mut second = Browser::new(&app);
    second.sign_in_as(&email, "correct horse battery").await;
    assert_eq!(first.get("/console").await.status(), 200);
    assert_eq!(second.get("/console").await.status(), 200);
    // Without its CSRF token the form does nothing.
    let res = first
        .post_form("/console/sign-out-everywhere", &[("csrf", "forged")])
        .await;
    assert_eq!(res.status(), 403);
    assert_eq!(second.get("/console").await.status(), 200);
    let csrf = first.csrf().await;
    let res = first
        .post_form("/console/sign-out-everywhere", &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(first.get("/console").await.status(), 303);
    assert_eq!(second.get("/console").await.status(), 303);
    let res = second.get("/console/api/manage/v2/network-volumes").await;
    problem(res, 401).await;
    // Signing in again works; plain sign-out ends only that session.
    first.sign_in_as(&email, "correct horse battery").await;
    second.sign_in_as(&email, "correct horse battery").await;
    let csrf = first.csrf().await;
    assert_eq!(
        first
            .post_form("/console/sign-out", &[("csrf", csrf.as_str())])
            .await
            .status(),
        303
    );
    assert_eq!(first.get("/console").await.status(), 303);
    assert_eq!(second.get("/console").await.status(), 200);
    // A new password ends the sessions too.
    app.auth.set_password(&email, "a brand new password").await.unwrap();
    assert_eq!(second.get("/console").await.status(), 303);
    // A session ends when it expires.
    second.sign_in_as(&email, "a brand new password").await;
    assert_eq!(second.get("/console").await.status(), 200);
    app.sql("UPDATE console_sessions SET expires_at = 1 WHERE ended_at IS NULL")
        .await;
    assert_eq!(second.get("/console").await.status(), 303);
    problem(second.get("/console/api/manage/v2/network-volumes").await, 401).await;
}

// ---- a browser without a browser: cookies and forms by hand ----------------

pub async fn user_with_password(app: &TestApp, password: &str, role: Role) -> String {
    let (email, _) = app.user_with_key("all").await;
    app.auth.set_password(&email, password).await.unwrap();
    app.auth.set_role(&email, role).await.unwrap();
    email
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("gantry_session=") && !v.starts_with("gantry_session=;"))
        .map(|v| {
            v.split(';')
                .next()
                .unwrap()
                .trim_start_matches("gantry_session=")
                .to_owned()
        })
}

fn form_token(headers: &HeaderMap, body: &str) -> (String, String) {
    let cookie = headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("gantry_form="))
        .map(|v| v.split(';').next().unwrap().to_owned())
        .expect("form cookie");
    let marker = "name=\"form\" value=\"";
    let at = body.find(marker).expect("form token") + marker.len();
    let token = body[at..].split('"').next().unwrap().to_owned();
    (cookie, token)
}

struct Browser {
    client: Client,
    base: String,
    cookie: Option<String>,
    email: String,
}

impl Browser {
    fn new(app: &TestApp) -> Self {
        Self {
            client: Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: app.base.clone(),
            cookie: None,
            email: String::new(),
        }
    }

    async fn signed_in(app: &TestApp, role: Role) -> Self {
        let email = user_with_password(app, "correct horse battery", role).await;
        let mut browser = Self::new(app);
        browser.sign_in_as(&email, "correct horse battery").await;
        browser
    }

    async fn sign_in_as(&mut self, email: &str, password: &str) {
        let res = self.sign_in(email, password).await;
        assert_eq!(res.status(), 303);
        self.cookie = Some(session_cookie(res.headers()).expect("session cookie"));
        self.email = email.to_owned();
    }

    fn cookie_header(&self) -> String {
        format!("gantry_session={}", self.cookie.as_deref().unwrap_or(""))
    }

    async fn sign_in(&self, email: &str, password: &str) -> Response {
        self.sign_in_to(email, password, "/console").await
    }

    async fn sign_in_to(&self, email: &str, password: &str, next: &str) -> Response {
        let form = format!("/console/sign-in?next={}", next.replace('/', "%2F"));
        self.fill_in(&form, "/console/sign-in", email, password, Some(next))
            .await
    }

    async fn submit(&self, path: &str, email: &str, password: &str) -> Response {
        self.fill_in(path, path, email, password, None).await
    }

    /// Loads the form at `form` (its token and cookie) and posts it to `action`.
    async fn fill_in(&self, form: &str, action: &str, email: &str, password: &str, next: Option<&str>) -> Response {
        let page = self.get(form).await;
        let headers = page.headers().clone();
        let (cookie, token) = form_token(&headers, &page.text().await.unwrap());
        let mut fields = vec![("email", email), ("password", password), ("form", token.as_str())];
        if let Some(next) = next {
            fields.push(("next", next));
        }
        self.client
            .post(format!("{}{action}", self.base))
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(&fields))
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> Response {
        let mut req = self.client.get(format!("{}{path}", self.base));
        if self.cookie.is_some() {
            req = req.header("cookie", self.cookie_header());
        }
        req.send().await.unwrap()
    }

    async fn get_text(&self, path: &str) -> String {
        let res = self.get(path).await;
        assert_eq!(res.status(), 200, "{path}");
        res.text().await.unwrap()
    }

    /// The page's CSRF token (its `<meta name="csrf-token">`).
    async fn csrf(&self) -> String {
        let page = self.get_text("/console").await;
        let marker = "name=\"csrf-token\" content=\"";
        let at = page.find(marker).expect("csrf meta") + marker.len();
        page[at..].split('"').next().unwrap().to_owned()
    }

    async fn api(&self, method: Method, path: &str, body: Value) -> Response {
        let csrf = self.csrf().await;
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .header("x-csrf-token", csrf);
        if !body.is_null() {
            req = req.json(&body);
        }
        req.send().await.unwrap()
    }

    async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(fields))
            .send()
            .await
            .unwrap()
    }
}

fn form_body(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
                b' ' => "+".to_owned(),
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Unix seconds as the console shows them (`2026-11-28 13:05:09 UTC`).
fn html_time(secs: i64) -> String {
    gantry_billing::history::format_rfc3339(secs * 1000)
        .replacen('T', " ", 1)
        .replace('Z', " UTC")
}
