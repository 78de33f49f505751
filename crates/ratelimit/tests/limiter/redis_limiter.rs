//! Redis limiter against a private redis-server per test.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_ratelimit::{Decision, Error, FailMode, Outcome, Policy, RateLimiter, RedisConfig, Window};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::sf::parse_headers;
use crate::support::{ManualClock, RedisServer, redis_now_us, reset_secs};

/// The timeout of the limiters that a test makes Redis unavailable to (the
/// default's 50 ms).
const TIMEOUT_MS: u64 = 50;
/// The timeout of the limiters whose every check must be decided: room for a
/// loaded CI machine, where a 50 ms stall would turn a check into
/// `Unavailable` and fail a test about something else.
const ROOMY_TIMEOUT_MS: u64 = 2_000;

fn config(server: &RedisServer) -> RedisConfig {
    RedisConfig {
        url: server.url(),
        timeout_ms: ROOMY_TIMEOUT_MS,
        ..RedisConfig::default()
    }
}

async fn limiter(server: &RedisServer, fail_mode: FailMode) -> RateLimiter {
    RateLimiter::redis(&config(server), fail_mode)
        .await
        .expect("valid config")
}

/// A limiter with the short timeout, for the tests of outages.
async fn quick_limiter(server: &RedisServer, fail_mode: FailMode) -> RateLimiter {
    let config = RedisConfig {
        timeout_ms: TIMEOUT_MS,
        ..config(server)
    };
    RateLimiter::redis(&config, fail_mode).await.expect("valid config")
}

async fn decide(l: &RateLimiter, user: &str, policy: &Policy) -> Decision {
    match l.check(user, policy).await {
        Outcome::Decided(d) => d,
        other => panic!("redis limiter returned {other:?}"),
    }
}

fn remaining(d: &Decision) -> [u64; 3] {
    d.windows().map(|w| w.remaining)
}

fn script_sha() -> String {
    redis::Script::new(include_str!("../../src/limit.lua"))
        .get_hash()
        .to_owned()
}

async fn field(conn: &mut MultiplexedConnection, key: &str, f: &str) -> Option<u64> {
    conn.hget(key, f).await.expect("HGET")
}

/// Redis time cannot be frozen: make sure the next second stays inside one minute window.
async fn ensure_minute_headroom(conn: &mut MultiplexedConnection) {
    let left_us = 60_000_000 - redis_now_us(conn).await % 60_000_000;
    if left_us < 1_000_000 {
        tokio::time::sleep(Duration::from_micros(left_us + 10_000)).await;
    }
}

#[tokio::test]
async fn headers_are_exact_and_follow_the_redis_clock() {
    let server = RedisServer::start();
    let l = limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    let policy = Policy::default();
    let mut n = 0u64;
    let user = "alice";
    ensure_minute_headroom(&mut conn).await;
    for _ in 0..6 {
        let before = redis_now_us(&mut conn).await;
        let d = decide(&l, user, &policy).await;
        let after = redis_now_us(&mut conn).await;
        n += 1;
        assert!(d.allowed());
        assert_eq!(
            d.policy_header(),
            r#""minute";q=600;w=60, "hour";q=20000;w=3600, "day";q=200000;w=86400"#
        );
        let parsed = parse_headers(&d.policy_header(), &d.ratelimit_header());
        for (i, (name, q, w, r, t)) in parsed.into_iter().enumerate() {
            let window = Window::ALL[i];
            assert_eq!(name, window.name());
            assert_eq!((q as u64, w as u64), (policy.quota(window), window.secs()));
            assert_eq!(r as u64, policy.quota(window) - n, "r must count down by one");
            let (hi, lo) = (reset_secs(before, w as u64), reset_secs(after, w as u64));
            assert!((lo..=hi).contains(&(t as u64)), "{name}: t={t} not in {lo}..={hi}");
        }
        let [m, h, dd] = d.windows().map(|w| (w.remaining, w.reset_secs));
        assert_eq!(
            d.ratelimit_header(),
            format!(
                "\"minute\";r={};t={}, \"hour\";r={};t={}, \"day\";r={};t={}",
                m.0, m.1, h.0, h.1, dd.0, dd.1
            )
        );
    }
}

#[tokio::test]
async fn keys_share_one_hash_tag_and_expire_with_their_window() {
    let server = RedisServer::start();
    let l = limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    for (user, tag) in [("alice", "alice"), ("}x{", "%7Dx%7B"), ("", "%")] {
        let before = redis_now_us(&mut conn).await;
        let d = decide(&l, user, &Policy::default()).await;
        assert!(d.allowed());
        for window in Window::ALL {
            let key = format!("gantry:rl:{{{tag}}}:{}", window.name());
            assert_eq!(field(&mut conn, &key, "n").await, Some(1), "{key}");
            let start = before / 1_000_000 / window.secs() * window.secs();
            assert_eq!(field(&mut conn, &key, "s").await, Some(start), "{key}");
            let expire_at: i64 = redis::cmd("EXPIRETIME").arg(&key).query_async(&mut conn).await.unwrap();
            assert_eq!(expire_at as u64, start + window.secs(), "{key} must die at window end");
        }
    }
    let keys: Vec<String> = conn.keys("*").await.unwrap();
    assert_eq!(keys.len(), 9, "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_get_exactly_the_quota() {
    let server = RedisServer::start();
    let l = Arc::new(limiter(&server, FailMode::Closed).await);
    let mut conn = server.conn().await;
    // The hour quota binds: an hour boundary during the test is practically impossible.
    let policy = Policy::new(10_000, 100, 10_000);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                for _ in 0..5 {
                    let d = decide(&l, "hot", &policy).await;
                    if d.allowed() {
                        admitted.push(d.windows()[1].remaining);
                    } else {
                        assert_eq!(d.exceeded_window(), Some(Window::Hour));
                    }
                }
                admitted
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.unwrap());
    }
    assert_eq!(seen.len(), 100, "admitted {} of 320 against quota 100", seen.len());
    let distinct: BTreeSet<u64> = seen.into_iter().collect();
    assert_eq!(distinct, (0..100).collect());
    for w in ["minute", "hour", "day"] {
        let key = format!("gantry:rl:{{hot}}:{w}");
        assert_eq!(field(&mut conn, &key, "n").await, Some(100), "{key}");
    }
}

#[tokio::test]
async fn denied_requests_name_the_window_and_consume_nothing() {
    let server = RedisServer::start();
    let l = limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    let policy = Policy::new(3, 10, 100);
    ensure_minute_headroom(&mut conn).await;
    {
        for n in 1..=3 {
            assert_eq!(remaining(&decide(&l, "bob", &policy).await), [3 - n, 10 - n, 100 - n]);
        }
        for _ in 0..20 {
            let d = decide(&l, "bob", &policy).await;
            assert!(!d.allowed());
            assert_eq!(d.exceeded_window(), Some(Window::Minute));
            assert_eq!(d.retry_after_secs(), Some(d.windows()[0].reset_secs));
            assert_eq!(remaining(&d), [0, 7, 97]);
        }
    }
    for w in ["minute", "hour", "day"] {
        let key = format!("gantry:rl:{{bob}}:{w}");
        assert_eq!(field(&mut conn, &key, "n").await, Some(3), "{key} counted a denial");
    }
    // Pretend the minute window ended: its stored start now lies one window back.
    let key = "gantry:rl:{bob}:minute";
    let start = field(&mut conn, key, "s").await.unwrap();
    let () = conn.hset(key, "s", start - 60).await.unwrap();
    let d = decide(&l, "bob", &policy).await;
    assert!(d.allowed(), "a new minute must admit again");
    assert_eq!(remaining(&d), [2, 6, 96], "hour and day kept only admitted requests");
}

#[tokio::test]
async fn retry_after_is_the_longest_of_the_exceeded_windows() {
    let server = RedisServer::start();
    let l = limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    for (i, (policy, window)) in [
        (Policy::new(2, 2, 100), Window::Hour),
        (Policy::new(2, 100, 2), Window::Day),
        (Policy::new(2, 2, 2), Window::Day),
        (Policy::new(10, 2, 100), Window::Hour),
    ]
    .into_iter()
    .enumerate()
    {
        let user = format!("user-{i}");
        assert!(decide(&l, &user, &policy).await.allowed());
        assert!(decide(&l, &user, &policy).await.allowed());
        let before = redis_now_us(&mut conn).await;
        let d = decide(&l, &user, &policy).await;
        let after = redis_now_us(&mut conn).await;
        assert_eq!(d.exceeded_window(), Some(window), "{policy:?}");
        let retry = d.retry_after_secs().unwrap();
        let (hi, lo) = (reset_secs(before, window.secs()), reset_secs(after, window.secs()));
        assert!((lo..=hi).contains(&retry), "{policy:?}: {retry} not in {lo}..={hi}");
        let exceeded = d.windows().iter().filter(|w| w.remaining == 0);
        assert!(exceeded.clone().count() >= 1);
        assert!(exceeded.clone().all(|w| w.reset_secs <= retry), "{policy:?}");
    }
}

#[tokio::test]
async fn both_limiters_decide_identically() {
    let server = RedisServer::start();
    let redis_l = limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    let policy = Policy::new(4, 6, 5);
    ensure_minute_headroom(&mut conn).await;
    let mem_l = RateLimiter::in_memory_with_clock(ManualClock::at_micros(redis_now_us(&mut conn).await));
    let mut mem_seq = Vec::new();
    let mut redis_seq = Vec::new();
    for _ in 0..8 {
        let summary = |d: Decision| (d.allowed(), remaining(&d), d.exceeded_window());
        mem_seq.push(summary(decide(&mem_l, "same", &policy).await));
        redis_seq.push(summary(decide(&redis_l, "same", &policy).await));
    }
    assert_eq!(mem_seq, redis_seq);
    assert_eq!(mem_seq.iter().filter(|s| s.0).count(), 4);
}

/// Calls per command name since the last CONFIG RESETSTAT.
async fn command_calls(conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_is_one_evalsha_round_trip() {
    let server = RedisServer::start();
    let l = Arc::new(limiter(&server, FailMode::Closed).await);
    let mut conn = server.conn().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let l = l.clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    decide(&l, &format!("rt-{i}"), &Policy::default()).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = command_calls(&mut conn).await;
    assert_eq!(calls.get("evalsha"), Some(&400), "{calls:?}");
    // Connection health checks happen only when a connection is (re)taken from the pool.
    let pings = calls.get("ping").copied().unwrap_or(0);
    assert!(pings <= 4, "{pings} PINGs for 400 checks: {calls:?}");
    assert_eq!(calls.get("eval"), None);
}

async fn expect_unavailable_quickly(l: &RateLimiter, mode: FailMode) {
    let started = Instant::now();
    let outcome = l.check("carol", &Policy::default()).await;
    let took = started.elapsed();
    assert_eq!(outcome, Outcome::Unavailable { fail_mode: mode });
    assert_eq!(outcome.admit(), mode == FailMode::Open);
    // Without the timeout a frozen Redis would hold the check forever; the
    // slack above it is for a loaded CI machine, not part of the contract.
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 450),
        "check took {took:?} with a {TIMEOUT_MS} ms timeout"
    );
}

/// Polls until the limiter decides again; returns that decision.
async fn await_recovery(l: &RateLimiter, user: &str) -> Decision {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Outcome::Decided(d) = l.check(user, &Policy::default()).await {
            return d;
        }
        assert!(Instant::now() < deadline, "limiter did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_killed_redis_is_unavailable_fast_and_a_restarted_one_is_used_again() {
    let mut server = RedisServer::start();
    let open = quick_limiter(&server, FailMode::Open).await;
    let closed = quick_limiter(&server, FailMode::Closed).await;
    for l in [&open, &closed] {
        for _ in 0..4 {
            decide(l, "carol", &Policy::default()).await;
        }
    }
    server.kill();
    for _ in 0..6 {
        expect_unavailable_quickly(&open, FailMode::Open).await;
        expect_unavailable_quickly(&closed, FailMode::Closed).await;
    }
    server.spawn();
    let mut conn = server.conn().await;
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(script_sha())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, [false], "a fresh server has no scripts");
    let d = await_recovery(&open, "carol").await;
    assert!(d.allowed());
    assert_eq!(
        remaining(&d),
        [599, 19_999, 199_999],
        "restarted Redis starts from zero"
    );
    let d = await_recovery(&closed, "carol").await;
    assert_eq!(remaining(&d), [598, 19_998, 199_998]);
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(script_sha())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, [true], "the script was reloaded");
}

#[tokio::test]
async fn a_frozen_redis_times_out_and_is_used_again_once_it_thaws() {
    let server = RedisServer::start();
    let open = quick_limiter(&server, FailMode::Open).await;
    let closed = quick_limiter(&server, FailMode::Closed).await;
    let mut conn = server.conn().await;
    let started = redis_now_us(&mut conn).await;
    decide(&open, "dave", &Policy::default()).await;
    decide(&closed, "dave", &Policy::default()).await;
    server.signal("-STOP");
    for _ in 0..3 {
        expect_unavailable_quickly(&open, FailMode::Open).await;
        expect_unavailable_quickly(&closed, FailMode::Closed).await;
    }
    server.signal("-CONT");
    let d = await_recovery(&open, "dave").await;
    let ended = redis_now_us(&mut conn).await;
    // Redis time cannot be frozen, so the freeze can straddle a window's
    // boundary; that window then holds only the request after it.
    let expected = [(60, 600), (3_600, 20_000), (86_400, 200_000)].map(|(len, quota)| {
        let window = |us: u64| us / (len * 1_000_000);
        if window(started) == window(ended) {
            quota - 3
        } else {
            quota - 1
        }
    });
    assert_eq!(
        remaining(&d),
        expected,
        "no data lost, no request double-counted (Redis time {started}..{ended} us)"
    );
    await_recovery(&closed, "dave").await;
}

#[tokio::test]
async fn unreachable_at_startup_is_an_outage_not_an_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = RedisConfig {
        url: format!("redis://127.0.0.1:{port}"),
        timeout_ms: TIMEOUT_MS,
        ..RedisConfig::default()
    };
    let l = RateLimiter::redis(&cfg, FailMode::Closed)
        .await
        .expect("startup must not fail");
    expect_unavailable_quickly(&l, FailMode::Closed).await;
    assert_eq!(l.tracked_users(), None);

    let bad = RedisConfig {
        url: "http://nope".into(),
        ..RedisConfig::default()
    };
    assert!(matches!(
        RateLimiter::redis(&bad, FailMode::Open).await,
        Err(Error::Config(_))
    ));
    let zero = RedisConfig {
        timeout_ms: 0,
        ..RedisConfig::default()
    };
    assert!(matches!(
        RateLimiter::redis(&zero, FailMode::Open).await,
        Err(Error::Config(_))
    ));
}

/// Counts this crate's warn and info events per thread. It is installed globally, once:
/// tracing caches callsite interest process-wide, so a thread-scoped subscriber would miss
/// events whose callsite another test thread registered first.
struct CountingSubscriber;

type ThreadCounts = Vec<(std::thread::ThreadId, (usize, usize))>;
static LOG_COUNTS: std::sync::Mutex<ThreadCounts> = std::sync::Mutex::new(Vec::new());

impl tracing::Subscriber for CountingSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if !meta.target().starts_with("gantry_ratelimit") {
            return;
        }
        let mut counts = LOG_COUNTS.lock().unwrap();
        let me = std::thread::current().id();
        let i = match counts.iter().position(|(t, _)| *t == me) {
            Some(i) => i,
            None => {
                counts.push((me, (0, 0)));
                counts.len() - 1
            }
        };
        let entry = &mut counts[i].1;
        match *meta.level() {
            tracing::Level::WARN => entry.0 += 1,
            tracing::Level::INFO => entry.1 += 1,
            _ => {}
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// (warnings, infos) logged so far on this thread (the current-thread runtime polls here).
fn logged_here() -> (usize, usize) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(CountingSubscriber).expect("no other subscriber");
    });
    let counts = LOG_COUNTS.lock().unwrap();
    let me = std::thread::current().id();
    counts
        .iter()
        .find(|(t, _)| *t == me)
        .map(|(_, c)| *c)
        .unwrap_or_default()
}

#[tokio::test]
async fn an_outage_logs_one_warning_not_one_per_request_and_recovery_is_logged() {
    assert_eq!(logged_here(), (0, 0));
    let mut server = RedisServer::start();
    let l = quick_limiter(&server, FailMode::Open).await;
    decide(&l, "erin", &Policy::default()).await;
    server.kill();
    for _ in 0..50 {
        assert!(l.check("erin", &Policy::default()).await.admit());
    }
    assert_eq!(logged_here(), (1, 0), "50 failures within 10 s must log one warning");
    server.spawn();
    await_recovery(&l, "erin").await;
    decide(&l, "erin", &Policy::default()).await;
    assert_eq!(logged_here(), (1, 1), "recovery is logged once");
}
