//! `gantry-bench-stream`: live-stream latency against a running Gantry.
//!
//! Submits `--streams` echo jobs at once (`POST /v2/gantry-echo/run`), each
//! streaming `--chunks` chunks `--interval-ms` apart after `--sleep-ms` (so
//! every reader is attached before the first chunk), with `timestamps: true`:
//! each chunk carries the wall-clock time its worker sent it. A reader per job
//! follows `GET /v2/gantry-echo/stream/{id}` with `Accept: text/event-stream`
//! on its own connection and records, per chunk, the wall-clock time the
//! event's bytes were read minus that time. It checks that every chunk came
//! once, in order, and that the stream ended `COMPLETED`. Prints one JSON line.
//!
//! HTTP/1.1 by hand over tokio sockets on one thread, so that the client
//! takes as little of the machine as possible from the server it measures
//! (`bench/stream/client.py` is the same in Python, slower per event).
//!
//! ```text
//! gantry-bench-stream --base 127.0.0.1:8081 --key KEY [--streams 100]
//!     [--chunks 200] [--interval-ms 20] [--sleep-ms 1000] [--model gantry-echo]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Args {
    base: String,
    key: String,
    model: String,
    streams: usize,
    chunks: u64,
    interval_ms: u64,
    sleep_ms: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        base: String::new(),
        key: String::new(),
        model: "gantry-echo".into(),
        streams: 100,
        chunks: 200,
        interval_ms: 20,
        sleep_ms: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--base" => args.base = value,
            "--key" => args.key = value,
            "--model" => args.model = value,
            "--streams" => args.streams = value.parse().expect("--streams"),
            "--chunks" => args.chunks = value.parse().expect("--chunks"),
            "--interval-ms" => args.interval_ms = value.parse().expect("--interval-ms"),
            "--sleep-ms" => args.sleep_ms = value.parse().expect("--sleep-ms"),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        !args.base.is_empty() && !args.key.is_empty(),
        "--base and --key are required"
    );
    args
}

fn now_us() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

/// Sends a request and reads the status line and headers; returns the
/// status, whether the body is chunked, its length otherwise, and the reader.
async fn request(
    base: &str,
    method: &str,
    path: &str,
    key: &str,
    body: &str,
    extra: &str,
) -> (u16, bool, usize, BufReader<TcpStream>) {
    let mut socket = TcpStream::connect(base).await.expect("connect");
    socket.set_nodelay(true).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {base}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut chunked, mut length) = (false, 0usize);
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or((header, ""));
        match name.trim().to_ascii_lowercase().as_str() {
            "transfer-encoding" => chunked = value.trim().eq_ignore_ascii_case("chunked"),
            "content-length" => length = value.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    (status, chunked, length, reader)
}

/// The next piece of a chunked body, or `None` at its end.
async fn next_piece(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    reader.read_line(&mut line).await.ok()?;
    let size = usize::from_str_radix(line.trim(), 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut piece = vec![0; size + 2];
    reader.read_exact(&mut piece).await.ok()?;
    piece.truncate(size);
    Some(piece)
}

#[derive(Default)]
struct Outcome {
    latencies_us: Vec<i64>,
    problem: Option<String>,
}

async fn one(args: &Args) -> Outcome {
    let mut outcome = Outcome::default();
    let job = format!(
        r#"{{"input":{{"sleep_ms":{},"stream":{},"stream_interval_ms":{},"timestamps":true}}}}"#,
        args.sleep_ms, args.chunks, args.interval_ms
    );
    let path = format!("/v2/{}/run", args.model);
    let (status, _, length, mut reader) = request(&args.base, "POST", &path, &args.key, &job, "").await;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.unwrap();
    let submitted: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if status != 200 {
        outcome.problem = Some(format!("submit answered {status}: {submitted}"));
        return outcome;
    }
    let id = submitted["id"].as_str().unwrap().to_string();
    let path = format!("/v2/{}/stream/{id}", args.model);
    let (status, chunked, _, mut reader) =
        request(&args.base, "GET", &path, &args.key, "", "Accept: text/event-stream\r\n").await;
    if status != 200 || !chunked {
        outcome.problem = Some(format!("stream answered {status}"));
        return outcome;
    }
    let (mut pending, mut next, mut last) = (String::new(), 0u64, None::<String>);
    while let Some(piece) = next_piece(&mut reader).await {
        let arrived = now_us();
        pending.push_str(&String::from_utf8_lossy(&piece));
        while let Some(end) = pending.find("\n\n") {
            let block: String = pending.drain(..end + 2).collect();
            let (mut name, mut data) = ("message", String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = if v == "chunk" {
                        "chunk"
                    } else if v == "status" {
                        "status"
                    } else {
                        "other"
                    };
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            let value: serde_json::Value = serde_json::from_str(&data).unwrap_or_default();
            match name {
                "chunk" => {
                    let output = &value["output"];
                    if output["chunk"].as_u64() != Some(next) {
                        outcome.problem = Some(format!("{id}: chunk {} where {next} was due", output["chunk"]));
                    }
                    next += 1;
                    outcome
                        .latencies_us
                        .push(arrived - output["sent_at_us"].as_i64().unwrap_or(arrived));
                }
                "status" => last = value["status"].as_str().map(str::to_string),
                _ => {}
            }
        }
    }
    if next != args.chunks {
        outcome
            .problem
            .get_or_insert(format!("{id}: {next} of {} chunks", args.chunks));
    }
    if last.as_deref() != Some("COMPLETED") {
        outcome.problem.get_or_insert(format!("{id}: ended {last:?}"));
    }
    outcome
}

fn main() {
    let args = parse_args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let outcomes = runtime.block_on(async {
        let args = std::rc::Rc::new(args);
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let tasks: Vec<_> = (0..args.streams)
                    .map(|_| {
                        let args = std::rc::Rc::clone(&args);
                        tokio::task::spawn_local(async move { one(&args).await })
                    })
                    .collect();
                let mut outcomes = Vec::new();
                for task in tasks {
                    outcomes.push(task.await.unwrap());
                }
                (outcomes, args)
            })
            .await
    });
    let wall = started.elapsed();
    let (outcomes, args) = outcomes;
    let mut latencies: Vec<i64> = outcomes.iter().flat_map(|o| o.latencies_us.iter().copied()).collect();
    latencies.sort_unstable();
    let problems: Vec<&String> = outcomes.iter().filter_map(|o| o.problem.as_ref()).collect();
    let pick = |p: f64| {
        if latencies.is_empty() {
            return 0.0;
        }
        let at = ((p / 100.0) * (latencies.len() - 1) as f64).round() as usize;
        latencies[at.min(latencies.len() - 1)] as f64 / 1000.0
    };
    let streaming = wall.saturating_sub(Duration::from_millis(args.sleep_ms)).as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "client": "gantry-bench-stream",
            "streams": args.streams,
            "chunks_per_stream": args.chunks,
            "interval_ms": args.interval_ms,
            "chunks": latencies.len(),
            "wall_s": (wall.as_secs_f64() * 100.0).round() / 100.0,
            "chunks_per_s": ((latencies.len() as f64 / streaming.max(1e-9)) * 10.0).round() / 10.0,
            "p50_ms": pick(50.0),
            "p90_ms": pick(90.0),
            "p99_ms": pick(99.0),
            "max_ms": latencies.last().map_or(0.0, |v| *v as f64 / 1000.0),
            "problem_count": problems.len(),
            "problems": problems.iter().take(5).collect::<Vec<_>>(),
        })
    );
}
