//! Throughput and latency of the limiters.
//!
//! cargo run --release --example bench -- [--redis redis://127.0.0.1:PORT] [--n N]
//!     [--redis-n N] [--tasks T] [--users U]

use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_ratelimit::{FailMode, Outcome, Policy, RateLimiter, RedisConfig};

struct Args {
    redis: Option<String>,
    n: usize,
    redis_n: usize,
    tasks: usize,
    users: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        n: 2_000_000,
        redis_n: 200_000,
        tasks: 64,
        users: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--redis" => args.redis = Some(value()?),
            "--n" => args.n = number(value()?)?,
            "--redis-n" => args.redis_n = number(value()?)?,
            "--tasks" => args.tasks = number(value()?)?.max(1),
            "--users" => args.users = number(value()?)?.max(1),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(args)
}

/// Quotas high enough that every request is admitted (the full counting path).
const POLICY: Policy = Policy::new(u64::MAX / 4, u64::MAX / 4, u64::MAX / 4);

fn report(label: &str, count: usize, elapsed: Duration, mut lat_ns: Vec<u64>) {
    lat_ns.sort_unstable();
    let pct = |p: f64| {
        let i = ((lat_ns.len() as f64 * p) as usize).min(lat_ns.len().saturating_sub(1));
        lat_ns.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    println!(
        "{label:<38} {:>12.0} decisions/s   p50 {:>8.2} µs   p99 {:>8.2} µs   p99.9 {:>8.2} µs   max {:>9.2} µs",
        count as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        pct(0.999),
        pct(1.0),
    );
}

fn users(n: usize, tag: &str) -> Arc<Vec<String>> {
    Arc::new((0..n).map(|i| format!("{tag}-user-{i}")).collect())
}

async fn memory_single_thread(n: usize, users: &[String]) {
    let limiter = RateLimiter::in_memory();
    // Warm-up: fills the maps so the timed runs measure steady state.
    for u in users {
        limiter.check(u, &POLICY).await;
    }
    let start = Instant::now();
    let mut admitted = 0usize;
    for i in 0..n {
        admitted += limiter.check(&users[i % users.len()], &POLICY).await.admit() as usize;
    }
    let elapsed = start.elapsed();
    assert_eq!(admitted, n, "every request should have been admitted");
    println!(
        "{:<38} {:>12.0} decisions/s   ({n} decisions in {elapsed:.2?}, no per-call timing)",
        "memory, 1 thread, throughput",
        n as f64 / elapsed.as_secs_f64()
    );

    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let outcome = limiter.check(&users[i % users.len()], &POLICY).await;
        lat.push(t.elapsed().as_nanos() as u64);
        std::hint::black_box(outcome);
    }
    report("memory, 1 thread, timed calls", n, start.elapsed(), lat);
}

async fn redis_concurrent(url: &str, total: usize, tasks: usize, users: Arc<Vec<String>>) {
    let prefix = format!("gantry:rl:bench:{}", std::process::id());
    let config = RedisConfig {
        url: url.to_owned(),
        key_prefix: prefix.clone(),
        ..RedisConfig::default()
    };
    let limiter = match RateLimiter::redis(&config, FailMode::Closed).await {
        Ok(l) => Arc::new(l),
        Err(e) => {
            eprintln!("redis limiter: {e}");
            return;
        }
    };
    // Warm-up: opens the connections and loads the script.
    for u in users.iter().take(100) {
        limiter.check(u, &POLICY).await;
    }
    let per_task = total / tasks;
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = limiter.clone();
            let users = users.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                let mut unavailable = 0usize;
                for i in 0..per_task {
                    let user = &users[(t * per_task + i) % users.len()];
                    let s = Instant::now();
                    let outcome = limiter.check(user, &POLICY).await;
                    lat.push(s.elapsed().as_nanos() as u64);
                    if matches!(outcome, Outcome::Unavailable { .. }) {
                        unavailable += 1;
                    }
                }
                (lat, unavailable)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(per_task * tasks);
    let mut unavailable = 0;
    for h in handles {
        match h.await {
            Ok((l, u)) => {
                lat.extend(l);
                unavailable += u;
            }
            Err(e) => eprintln!("task failed: {e}"),
        }
    }
    let elapsed = start.elapsed();
    let count = lat.len();
    report(&format!("redis, {tasks} tasks (2 worker threads)"), count, elapsed, lat);
    println!("  unavailable (timeouts/errors): {unavailable} of {count}");
    cleanup(url, &prefix).await;
}

/// Deletes the bench's keys so a shared Redis is left as it was.
async fn cleanup(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor = 0u64;
    let mut deleted = 0usize;
    loop {
        let reply: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await;
        let Ok((next, keys)) = reply else { break };
        if !keys.is_empty() {
            let removed: redis::RedisResult<usize> = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
            deleted += removed.unwrap_or(0);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    println!("  cleaned up {deleted} bench keys under {prefix}:*");
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let users_list = users(args.users, "bench");

    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(memory_single_thread(args.n, &users_list)),
        Err(e) => eprintln!("runtime: {e}"),
    }

    if let Some(url) = &args.redis {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(redis_concurrent(url, args.redis_n, args.tasks, users_list.clone())),
            Err(e) => eprintln!("runtime: {e}"),
        }
    }
}
