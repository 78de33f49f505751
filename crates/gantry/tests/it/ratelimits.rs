use std::time::Duration;

use gantry_ratelimit::{FailMode, Policy};
use gantry_testkit::RedisServer;
use reqwest::{Method, Response};
use serde_json::json;

use crate::harness::{Backend, TestApp, problem};

#[derive(Debug, Clone, Copy)]
enum Limiter {
    Memory,
    Redis,
}

/// Spawns the app with the given default management policy, on the chosen limiter.
async fn spawn(limiter: Limiter, policy: Policy, fail_mode: FailMode) -> (TestApp, Option<RedisServer>) {
    let redis = matches!(limiter, Limiter::Redis).then(RedisServer::start);
    let url = redis.as_ref().map(|r| r.url());
    let app = TestApp::spawn_with(Backend::Sqlite, move |s| {
        s.rate_limits.management = policy;
        s.rate_limits.fail_mode = fail_mode;
        s.redis_url = url;
        // Not the 50 ms default: on a loaded CI machine a slow check would
        // fail open (no headers) or closed (503) and break a counting test.
        s.rate_limits.redis_timeout_ms = 2_000;
        s.auth.cache_ttl_ms = 50;
    })
    .await;
    (app, redis)
}

/// Fixed windows reset on the minute: start a counting test well clear of the edge.
async fn away_from_minute_edge() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into_minute = now.as_secs_f64() % 60.0;
    if into_minute > 50.0 {
        tokio::time::sleep(Duration::from_secs_f64(60.2 - into_minute)).await;
    }
}

/// Parses `"minute";r=4;t=42, …` strictly into (name, [(param, value)]).
fn parse_list(header: &str) -> Vec<(String, Vec<(String, u64)>)> {
    header
        .split(", ")
        .map(|member| {
            let mut parts = member.split(';');
            let name = parts.next().unwrap();
            assert!(
                name.starts_with('"') && name.ends_with('"') && name.len() > 2,
                "quoted name: {member}"
            );
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    assert!(k.chars().all(|c| c.is_ascii_lowercase()), "param key: {p}");
                    (
                        k.to_string(),
                        v.parse::<u64>().unwrap_or_else(|_| panic!("integer param: {p}")),
                    )
                })
                .collect();
            (name.trim_matches('"').to_string(), params)
        })
        .collect()
}

fn header(res: &Response, name: &str) -> Option<String> {
    res.headers().get(name).and_then(|v| v.to_str().ok()).map(String::from)
}

/// The `r` and `t` of each window, checking the header's exact shape.
fn remaining(res: &Response) -> Vec<(u64, u64)> {
    let value = header(res, "ratelimit").expect("RateLimit header");
    let parsed = parse_list(&value);
    let names: Vec<&str> = parsed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["minute", "hour", "day"]);
    parsed
        .iter()
        .zip([60, 3600, 86400])
        .map(|((_, params), window)| {
            assert_eq!(params.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["r", "t"]);
            let (r, t) = (params[0].1, params[1].1);
            assert!((1..=window).contains(&t), "t={t} within the {window}s window");
            (r, t)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_count_down_and_429_names_the_window_in_memory() {
    headers_count_down_and_429_names_the_window(Limiter::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_count_down_and_429_names_the_window_on_redis() {
    headers_count_down_and_429_names_the_window(Limiter::Redis).await;
}

async fn headers_count_down_and_429_names_the_window(limiter: Limiter) {
    let (app, _redis) = spawn(limiter, Policy::new(5, 100, 1000), FailMode::Open).await;
    let (_, key) = app.user_with_key("volumes:read").await;
    away_from_minute_edge().await;
    let policy = r#""minute";q=5;w=60, "hour";q=100;w=3600, "day";q=1000;w=86400"#;

    // Successes and errors after authentication alike carry both headers.
    let responses = [
        app.get("/v2/network-volumes", &key).await,
        app.get("/v2/network-volumes/missing", &key).await,
        app.send_json(Method::POST, "/v2/network-volumes", &key, &json!({}))
            .await,
        app.request(Method::PUT, "/v2/network-volumes", Some(&key))
            .send()
            .await
            .unwrap(),
        app.get("/v2/network-volumes", &key).await,
    ];
    let statuses: Vec<u16> = responses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [200, 404, 403, 405, 200]);
    for (i, res) in responses.iter().enumerate() {
        assert_eq!(header(res, "ratelimit-policy").as_deref(), Some(policy));
        let windows = remaining(res);
        let used = i as u64 + 1;
        assert_eq!(
            windows.iter().map(|w| w.0).collect::<Vec<_>>(),
            [5 - used, 100 - used, 1000 - used]
        );
    }

    let denied = app.get("/v2/network-volumes", &key).await;
    assert_eq!(header(&denied, "ratelimit-policy").as_deref(), Some(policy));
    let windows = remaining(&denied);
    assert_eq!(
        windows.iter().map(|w| w.0).collect::<Vec<_>>(),
        [0, 95, 995],
        "a denial consumes nothing"
    );
    let retry_after: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, windows[0].1, "Retry-After is the minute window's reset");
    let body = problem(denied, 429).await;
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["detail"], "rate limit exceeded for the minute window");

    // Unauthenticated answers carry no limit headers.
    let anonymous = app
        .request(Method::GET, "/v2/network-volumes", None)
        .send()
        .await
        .unwrap();
    assert!(header(&anonymous, "ratelimit").is_none() && header(&anonymous, "ratelimit-policy").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_exceeded_window_decides_retry_after() {
    let (app, _redis) = spawn(Limiter::Redis, Policy::new(3, 3, 1000), FailMode::Open).await;
    let (_, key) = app.user_with_key("volumes:read").await;
    for _ in 0..3 {
        assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
    }
    let denied = app.get("/v2/network-volumes", &key).await;
    let windows = remaining(&denied);
    assert_eq!(
        header(&denied, "retry-after").unwrap().parse::<u64>().unwrap(),
        windows[1].1
    );
    assert_eq!(
        problem(denied, 429).await["detail"],
        "rate limit exceeded for the hour window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_quota_is_admitted_under_a_race_in_memory() {
    exactly_the_quota_is_admitted_under_a_race(Limiter::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_quota_is_admitted_under_a_race_on_redis() {
    exactly_the_quota_is_admitted_under_a_race(Limiter::Redis).await;
}

async fn exactly_the_quota_is_admitted_under_a_race(limiter: Limiter) {
    let (app, _redis) = spawn(limiter, Policy::new(20, 1000, 1000), FailMode::Open).await;
    let (_, key) = app.user_with_key("volumes:read").await;
    away_from_minute_edge().await;
    let requests = (0..64).map(|_| app.get("/v2/network-volumes", &key));
    let responses = futures_util::future::join_all(requests).await;
    let admitted: Vec<&Response> = responses.iter().filter(|r| r.status() == 200).collect();
    let denied = responses.iter().filter(|r| r.status() == 429).count();
    assert_eq!((admitted.len(), denied), (20, 44));
    let mut left: Vec<u64> = admitted.iter().map(|r| remaining(r)[0].0).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        (0..20).collect::<Vec<_>>(),
        "each admitted request saw its own count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_overrides_and_exemptions_from_the_command_line() {
    let (app, _redis) = spawn(Limiter::Memory, Policy::new(5, 100, 1000), FailMode::Open).await;
    let (email, key) = app.user_with_key("volumes:read").await;
    away_from_minute_edge().await;

    let out = crate::cli::gantry(&app, &["users", "set-limits", &email, "--minute", "2", "--day", "50"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("minute=2 hour=default day=50 exempt=false"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = app.get("/v2/network-volumes", &key).await;
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some(r#""minute";q=2;w=60, "hour";q=100;w=3600, "day";q=50;w=86400"#)
    );
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
    problem(app.get("/v2/network-volumes", &key).await, 429).await;

    let out = crate::cli::gantry(&app, &["users", "set-limits", &email, "--exempt"]);
    assert!(out.status.success());
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..10 {
        let res = app.get("/v2/network-volumes", &key).await;
        assert_eq!(res.status(), 200, "exempt users are never limited");
        assert!(header(&res, "ratelimit").is_none() && header(&res, "ratelimit-policy").is_none());
    }

    let out = crate::cli::gantry(&app, &["users", "set-limits", &email, "--reset"]);
    assert!(out.status.success());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = app.get("/v2/network-volumes", &key).await;
    assert_eq!(res.status(), 200, "back on the default minute quota of 5 (3 used)");
    assert!(
        header(&res, "ratelimit-policy")
            .unwrap()
            .starts_with(r#""minute";q=5;w=60"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_fails_open_by_default_and_recovers() {
    let (app, redis) = spawn(Limiter::Redis, Policy::new(100, 1000, 1000), FailMode::Open).await;
    let mut redis = redis.unwrap();
    let (_, key) = app.user_with_key("volumes:read").await;
    assert!(header(&app.get("/v2/network-volumes", &key).await, "ratelimit").is_some());

    redis.kill();
    for _ in 0..3 {
        let res = app.get("/v2/network-volumes", &key).await;
        assert_eq!(res.status(), 200, "fail open: still served");
        assert!(header(&res, "ratelimit").is_none(), "no headers without a decision");
    }
    redis.spawn();
    let mut recovered = false;
    for _ in 0..50 {
        let res = app.get("/v2/network-volumes", &key).await;
        assert_eq!(res.status(), 200);
        if header(&res, "ratelimit").is_some() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "limiting resumes by itself when Redis is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_fails_closed_when_configured() {
    let (app, redis) = spawn(Limiter::Redis, Policy::new(100, 1000, 1000), FailMode::Closed).await;
    let mut redis = redis.unwrap();
    let (_, key) = app.user_with_key("volumes:read").await;
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);

    redis.kill();
    let res = app.get("/v2/network-volumes", &key).await;
    assert_eq!(header(&res, "retry-after").as_deref(), Some("1"));
    let body = problem(res, 503).await;
    assert_eq!(body["title"], "Service Unavailable");

    redis.spawn();
    let mut recovered = false;
    for _ in 0..50 {
        if app.get("/v2/network-volumes", &key).await.status() == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "serving resumes when Redis is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_endpoints_have_their_own_policy_and_counters() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| {
        s.rate_limits.management = Policy::new(50, 1000, 1000);
        s.rate_limits.public = Policy::new(2, 1000, 1000);
    })
    .await;
    let (_, key) = app.user_with_key("all").await;
    away_from_minute_edge().await;
    let run = || {
        app.client
            .post(format!("{}/v2/gantry-echo/run", app.public_base))
            .bearer_auth(&key)
            .json(&json!({"input": {}}))
            .send()
    };
    let first = run().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some(r#""minute";q=2;w=60, "hour";q=1000;w=3600, "day";q=1000;w=86400"#)
    );
    assert_eq!(remaining(&first)[0].0, 1);
    assert_eq!(run().await.unwrap().status(), 200);
    let denied = run().await.unwrap();
    assert!(header(&denied, "retry-after").is_some());
    assert_eq!(
        problem(denied, 429).await["detail"],
        "rate limit exceeded for the minute window"
    );

    // The management API counts separately, under its own policy.
    let managed = app.get("/v2/network-volumes", &key).await;
    assert_eq!(managed.status(), 200);
    assert_eq!(remaining(&managed)[0].0, 49);
}
