//! In-memory limiter, driven by a manual clock.

use std::collections::BTreeSet;
use std::sync::Arc;

use gantry_ratelimit::{Decision, Outcome, Policy, RateLimiter, Window};

use crate::sf::parse_headers;
use crate::support::{DAY0, ManualClock};

const S: u64 = 1_000_000;

fn limiter(clock: &Arc<ManualClock>) -> RateLimiter {
    RateLimiter::in_memory_with_clock(clock.clone())
}

async fn decide(l: &RateLimiter, user: &str, policy: &Policy) -> Decision {
    match l.check(user, policy).await {
        Outcome::Decided(d) => d,
        other => panic!("in-memory limiter returned {other:?}"),
    }
}

fn remaining(d: &Decision) -> [u64; 3] {
    d.windows().map(|w| w.remaining)
}

fn resets(d: &Decision) -> [u64; 3] {
    d.windows().map(|w| w.reset_secs)
}

#[tokio::test]
async fn headers_are_exact_and_r_counts_down_while_t_tracks_the_clock() {
    // 02:05:18.5 into the day.
    let clock = ManualClock::at_micros((DAY0 + 2 * 3600 + 5 * 60 + 18) * S + S / 2);
    let l = limiter(&clock);
    let policy = Policy::default();

    let d = decide(&l, "alice", &policy).await;
    assert!(d.allowed());
    assert_eq!(
        d.policy_header(),
        r#""minute";q=600;w=60, "hour";q=20000;w=3600, "day";q=200000;w=86400"#
    );
    assert_eq!(
        d.ratelimit_header(),
        r#""minute";r=599;t=42, "hour";r=19999;t=3282, "day";r=199999;t=78882"#
    );
    assert_eq!(d.exceeded_window(), None);
    assert_eq!(d.retry_after_secs(), None);

    for n in 1..=20u64 {
        clock.advance_micros(S);
        let d = decide(&l, "alice", &policy).await;
        let parsed = parse_headers(&d.policy_header(), &d.ratelimit_header());
        let expect = [
            ("minute", 600, 60, 599 - n, 42 - n),
            ("hour", 20_000, 3600, 19_999 - n, 3282 - n),
            ("day", 200_000, 86_400, 199_999 - n, 78_882 - n),
        ];
        for ((name, q, w, r, t), status) in expect.iter().zip(d.windows()) {
            let want = (name.to_string(), *q as i64, *w as i64, *r as i64, *t as i64);
            assert_eq!(parsed[status.window as usize], want);
            assert_eq!((status.remaining, status.reset_secs), (*r, *t));
        }
    }
}

#[tokio::test]
async fn t_is_the_whole_window_at_a_boundary_and_one_just_before_the_next() {
    let clock = ManualClock::at_secs(DAY0);
    let l = limiter(&clock);
    let d = decide(&l, "u", &Policy::default()).await;
    assert_eq!(resets(&d), [60, 3600, 86_400]);
    clock.set_micros((DAY0 + 3600) * S - 1);
    let d = decide(&l, "u", &Policy::default()).await;
    assert_eq!(resets(&d), [1, 1, 82_801]);
}

#[tokio::test]
async fn denied_requests_name_the_window_and_consume_nothing() {
    let clock = ManualClock::at_secs(DAY0 + 10);
    let l = limiter(&clock);
    let policy = Policy::new(3, 10, 100);
    for n in 1..=3 {
        let d = decide(&l, "bob", &policy).await;
        assert!(d.allowed());
        assert_eq!(remaining(&d), [3 - n, 10 - n, 100 - n]);
    }
    for _ in 0..50 {
        clock.advance_micros(S / 10);
        let d = decide(&l, "bob", &policy).await;
        assert!(!d.allowed());
        assert_eq!(d.exceeded_window(), Some(Window::Minute));
        assert_eq!(d.exceeded_window().map(Window::name), Some("minute"));
        assert_eq!(d.retry_after_secs(), Some(d.windows()[0].reset_secs));
        assert_eq!(remaining(&d), [0, 7, 97], "a denied request was counted");
    }
    // 15 s into the minute: retry in 45 s.
    assert_eq!(decide(&l, "bob", &policy).await.retry_after_secs(), Some(45));
    clock.set_micros((DAY0 + 60) * S);
    let d = decide(&l, "bob", &policy).await;
    assert!(d.allowed(), "the denials must not have extended the ban");
    assert_eq!(remaining(&d), [2, 6, 96]);
}

#[tokio::test]
async fn retry_after_is_the_longest_of_the_exceeded_windows() {
    let clock = ManualClock::at_secs(DAY0 + 3600 + 125);
    let l = limiter(&clock);
    for (policy, window, retry) in [
        (Policy::new(2, 2, 100), Window::Hour, 3600 - 125),
        (Policy::new(2, 100, 2), Window::Day, 86_400 - 3725),
        (Policy::new(2, 2, 2), Window::Day, 86_400 - 3725),
        (Policy::new(10, 2, 100), Window::Hour, 3600 - 125),
        (Policy::new(2, 100, 100), Window::Minute, 55),
    ] {
        let user = format!("{policy:?}");
        assert!(decide(&l, &user, &policy).await.allowed());
        assert!(decide(&l, &user, &policy).await.allowed());
        let d = decide(&l, &user, &policy).await;
        assert!(!d.allowed());
        assert_eq!(d.exceeded_window(), Some(window), "{policy:?}");
        assert_eq!(d.retry_after_secs(), Some(retry), "{policy:?}");
    }
    // A zero quota blocks outright.
    let d = decide(&l, "blocked", &Policy::new(0, 10, 10)).await;
    assert_eq!((d.allowed(), d.exceeded_window()), (false, Some(Window::Minute)));
}

#[tokio::test]
async fn windows_reset_exactly_at_their_epoch_aligned_boundaries() {
    let clock = ManualClock::at_secs(DAY0 + 7 * 3600 + 59 * 60 + 30);
    let l = limiter(&clock);
    let policy = Policy::new(1, 3, 6);
    let eight = DAY0 + 8 * 3600;
    assert!(decide(&l, "c", &policy).await.allowed());
    clock.set_micros(eight * S - 1);
    assert_eq!(decide(&l, "c", &policy).await.exceeded_window(), Some(Window::Minute));
    clock.set_micros(eight * S);
    let d = decide(&l, "c", &policy).await;
    assert!(d.allowed(), "a new minute (and hour) must admit again");
    assert_eq!(remaining(&d), [0, 2, 4]);
    clock.advance_micros(60 * S);
    assert!(decide(&l, "c", &policy).await.allowed());
    clock.advance_micros(60 * S);
    assert!(decide(&l, "c", &policy).await.allowed());
    clock.advance_micros(60 * S);
    let d = decide(&l, "c", &policy).await;
    assert_eq!(d.exceeded_window(), Some(Window::Hour));
    assert_eq!(d.retry_after_secs(), Some(3600 - 180));
    clock.set_micros((eight + 3600) * S);
    let d = decide(&l, "c", &policy).await;
    assert!(d.allowed());
    assert_eq!(remaining(&d), [0, 2, 1]);
    clock.advance_micros(60 * S);
    assert_eq!(remaining(&decide(&l, "c", &policy).await), [0, 1, 0]);
    clock.advance_micros(60 * S);
    let d = decide(&l, "c", &policy).await;
    assert_eq!(d.exceeded_window(), Some(Window::Day));
    assert_eq!(d.retry_after_secs(), Some(86_400 - 9 * 3600 - 120));
    clock.set_micros((DAY0 + 86_400) * S);
    assert_eq!(remaining(&decide(&l, "c", &policy).await), [0, 2, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_get_exactly_the_quota() {
    let clock = ManualClock::at_secs(DAY0 + 30);
    let l = Arc::new(limiter(&clock));
    let policy = Policy::new(100, 1000, 1000);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                for _ in 0..10 {
                    let d = decide(&l, "hot", &policy).await;
                    if d.allowed() {
                        admitted.push(d.windows()[0].remaining);
                    }
                    tokio::task::yield_now().await;
                }
                admitted
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.unwrap());
    }
    assert_eq!(seen.len(), 100, "admitted {} of 640 against quota 100", seen.len());
    let distinct: BTreeSet<u64> = seen.into_iter().collect();
    assert_eq!(distinct, (0..100).collect(), "each admission must see its own count");
    let d = decide(&l, "hot", &policy).await;
    assert_eq!(remaining(&d), [0, 900, 900]);
}

#[tokio::test]
async fn users_are_counted_separately() {
    let clock = ManualClock::at_secs(DAY0);
    let l = limiter(&clock);
    let policy = Policy::new(1, 10, 10);
    assert!(decide(&l, "a", &policy).await.allowed());
    assert!(!decide(&l, "a", &policy).await.allowed());
    assert!(decide(&l, "b", &policy).await.allowed());
    assert!(decide(&l, "", &policy).await.allowed());
}

#[tokio::test]
async fn entries_from_a_finished_day_are_pruned() {
    let clock = ManualClock::at_secs(DAY0 + 86_000);
    let l = limiter(&clock);
    let policy = Policy::default();
    for i in 0..1000 {
        decide(&l, &format!("old-{i}"), &policy).await;
    }
    // Denied-from-the-start requests create no state.
    decide(&l, "nobody", &Policy::new(0, 0, 0)).await;
    assert_eq!(l.tracked_users(), Some(1000));
    clock.advance_micros(3600 * S);
    for i in 0..1000 {
        decide(&l, &format!("new-{i}"), &policy).await;
    }
    assert_eq!(l.tracked_users(), Some(1000), "yesterday's users were kept");
}

#[tokio::test]
async fn a_thread_reading_the_clock_late_cannot_reopen_a_window() {
    let clock = ManualClock::at_secs(DAY0 + 60);
    let l = limiter(&clock);
    let policy = Policy::new(1, 10, 10);
    assert!(decide(&l, "d", &policy).await.allowed());
    // Slightly older reading (still inside the previous minute): treated as "now".
    clock.set_micros((DAY0 + 60) * S - 1000);
    let d = decide(&l, "d", &policy).await;
    assert!(!d.allowed(), "an old timestamp reset the minute count");
    assert_eq!(d.windows()[0].reset_secs, 60);
}

#[tokio::test]
async fn outcome_admit_follows_the_decision() {
    let clock = ManualClock::at_secs(DAY0);
    let l = limiter(&clock);
    let policy = Policy::new(1, 1, 1);
    assert!(l.check("e", &policy).await.admit());
    assert!(!l.check("e", &policy).await.admit());
}

#[test]
fn the_check_future_is_send_and_the_limiter_is_shareable() {
    fn assert_send<T: Send>(_: T) {}
    fn assert_sync<T: Send + Sync>() {}
    assert_sync::<RateLimiter>();
    let l = RateLimiter::in_memory();
    let p = Policy::default();
    assert_send(l.check("x", &p));
}
