//! The runtime against a real engine.
//!
//! These tests need the engine named by `DOCKER_HOST` and the images that `scripts/test-docker.sh
//! start` imports; they fail (rather than skip) without it, so that a CI run that lost its engine is
//! red instead of silently green. Locally:
//!
//! ```sh
//! sudo bash scripts/test-docker.sh start      # last line: DOCKER_HOST=unix:///tmp/gantry-test-docker/docker.sock
//! export DOCKER_HOST=unix:///tmp/gantry-test-docker/docker.sock
//! cargo test -p gantry-runtime
//! ```
//!
//! Every container is named and labelled after its test and this process, so concurrent runs do not
//! collide, and a guard removes it even when an assertion fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use gantry_runtime::{
    ContainerSpec, ContainerState, Docker, LogLine, LogStream, MAX_API_VERSION, Network, RegistryAuth, Runtime,
    RuntimeError,
};

const BUSYBOX: &str = "gantry-test/busybox:1";
const TEST_LABEL: &str = "gantry.runtime-test";
const RUN_LABEL: &str = "gantry.runtime-test.run";

fn docker_host() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.trim().is_empty() => host,
        _ => panic!(
            "DOCKER_HOST is not set. These tests need a real Docker engine with the test images: run \
             `sudo bash scripts/test-docker.sh start` and export the DOCKER_HOST=... line it prints."
        ),
    }
}

fn docker() -> Docker {
    Docker::connect(&docker_host()).expect("DOCKER_HOST is a unix:// or tcp:// address")
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// A spec for a busybox container on the host network, named and labelled for `test`.
fn busybox(test: &str, script: &str) -> ContainerSpec {
    let mut spec = ContainerSpec::new(format!("gantry-rt-{test}-{}", std::process::id()), BUSYBOX);
    spec.cmd = Some(vec!["sh".into(), "-c".into(), script.into()]);
    spec.network = Network::Host;
    spec.labels.insert(TEST_LABEL.into(), test.into());
    spec.labels.insert(RUN_LABEL.into(), std::process::id().to_string());
    spec
}

fn labels_of(spec: &ContainerSpec) -> Vec<(String, String)> {
    spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Removes a container when dropped, also when the test panics. It uses its own client on its own
/// runtime, because the test's runtime may be the one unwinding.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        let host = docker_host();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(d) = Docker::connect(&host) {
                    let _ = d.remove(&name).await;
                }
            });
        })
        .join();
    }
}

/// Polls the logs until `done` holds for them (containers print asynchronously to `run`).
async fn wait_for_logs(d: &Docker, id: &str, done: impl Fn(&[LogLine]) -> bool) -> Vec<LogLine> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let lines = d.logs(id, None, None).await.expect("logs");
        if done(&lines) {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "logs never got there: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn next_within(
    s: &mut futures_util::stream::BoxStream<'static, Result<LogLine, RuntimeError>>,
) -> Option<Result<LogLine, RuntimeError>> {
    tokio::time::timeout(Duration::from_secs(20), s.next())
        .await
        .expect("the stream moves within 20 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiates_down_to_the_engine_api_version() {
    let d = docker();
    assert_eq!(d.api_version(), None, "nothing is negotiated before the first call");
    let info = d.negotiate().await.expect("negotiate");
    eprintln!(
        "engine {} API {} (min {:?}) {}/{}",
        info.version, info.api_version, info.min_api_version, info.os, info.arch
    );
    let (major, minor) = info.api_version.split_once('.').expect("MAJOR.MINOR");
    let engine = (
        major.parse::<u32>().expect("major"),
        minor.parse::<u32>().expect("minor"),
    );
    let (want_major, want_minor) = engine.min(MAX_API_VERSION);
    assert_eq!(d.api_version(), Some(format!("{want_major}.{want_minor}")));
    assert_eq!(info.os, "linux");
    // The Debian 20.10 engine of scripts/test-docker.sh speaks 1.41 at most and refuses newer paths,
    // so every later call only works because of the negotiation.
    if info.version.starts_with("20.10") {
        assert_eq!(d.api_version().as_deref(), Some("1.41"));
    }
    // The versioned /version agrees, and clones share the negotiated version.
    assert_eq!(d.info().await.expect("info"), info);
    assert_eq!(d.clone().api_version(), d.api_version());

    // Without an explicit negotiate, the first operation negotiates by itself.
    let lazy = docker();
    lazy.list(&[("gantry.no-such-label".into(), "x".into())])
        .await
        .expect("list");
    assert_eq!(lazy.api_version(), d.api_version());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_lists_logs_stops_starts_and_removes_a_container() {
    let d = docker();
    let mut spec = busybox("lifecycle", r#"echo "out $FOO"; echo "err $BAR" >&2; exec sleep 300"#);
    spec.env = vec![
        ("FOO".into(), "foo-value".into()),
        ("BAR".into(), "with spaces = and equals".into()),
    ];
    spec.labels.insert("gantry.kind".into(), "pod".into());
    let _cleanup = Cleanup(spec.name.clone());
    let before = now_unix();
    let id = d.run(&spec).await.expect("run");
    assert_eq!(id.len(), 64, "a full container id: {id}");

    // Found by all of its labels; not found when one label does not match.
    let found = d.list(&labels_of(&spec)).await.expect("list");
    assert_eq!(found.len(), 1, "{found:?}");
    let c = &found[0];
    assert_eq!(
        (c.id.as_str(), c.name.as_str(), c.image.as_str()),
        (id.as_str(), spec.name.as_str(), BUSYBOX)
    );
    assert_eq!(c.labels, spec.labels);
    assert_eq!(c.state, ContainerState::Running);
    assert!(
        (before - 5..=now_unix() + 5).contains(&c.created_unix),
        "created {}",
        c.created_unix
    );
    let mut mismatched = labels_of(&spec);
    mismatched.push(("gantry.kind".into(), "worker".into()));
    assert!(
        d.list(&mismatched).await.expect("list").is_empty(),
        "labels must all match"
    );

    // Inspect by id and by name.
    let inspected = d.inspect(&id).await.expect("inspect");
    assert_eq!(inspected.state, ContainerState::Running);
    assert_eq!(
        (inspected.name.as_str(), inspected.image.as_str()),
        (spec.name.as_str(), BUSYBOX)
    );
    assert_eq!(inspected.labels, spec.labels);
    assert!(inspected.started_at.is_some() && inspected.exit_code.is_none() && inspected.error.is_none());
    assert!(inspected.ports.is_empty(), "host networking publishes nothing");
    assert_eq!(d.inspect(&spec.name).await.expect("inspect by name").id, id);

    // Both streams, told apart, with the env values intact and timestamps of about now.
    let lines = wait_for_logs(&d, &id, |l| l.len() >= 2).await;
    let out = lines
        .iter()
        .find(|l| l.stream == LogStream::Stdout)
        .expect("a stdout line");
    let err = lines
        .iter()
        .find(|l| l.stream == LogStream::Stderr)
        .expect("a stderr line");
    assert_eq!(out.line, "out foo-value");
    assert_eq!(err.line, "err with spaces = and equals");
    for l in [out, err] {
        let secs = l.ts_unix_nanos / 1_000_000_000;
        assert!(
            (before - 5..=now_unix() + 5).contains(&secs),
            "timestamp {} of {l:?}",
            l.ts_unix_nanos
        );
    }
    assert_eq!(d.logs(&id, Some(1), None).await.expect("tail").len(), 1);
    assert!(
        d.logs(&id, None, Some(now_unix() + 3600))
            .await
            .expect("since")
            .is_empty()
    );
    assert_eq!(d.logs(&id, None, Some(before - 60)).await.expect("since").len(), 2);

    // sleep is PID 1 and ignores SIGTERM, so it is killed after the grace period.
    d.stop(&id, Duration::from_secs(1)).await.expect("stop");
    let stopped = d.inspect(&id).await.expect("inspect");
    assert_eq!(
        (stopped.state.clone(), stopped.exit_code),
        (ContainerState::Exited, Some(137)),
        "{stopped:?}"
    );
    d.stop(&id, Duration::from_secs(1))
        .await
        .expect("stopping a stopped container is fine");
    let listed = d.list(&labels_of(&spec)).await.expect("list");
    assert_eq!(
        (listed[0].state.clone(), listed[0].exit_code),
        (ContainerState::Exited, Some(137))
    );

    d.start(&id).await.expect("start");
    assert_eq!(d.inspect(&id).await.expect("inspect").state, ContainerState::Running);
    d.start(&id).await.expect("starting a running container is fine");
    // A restarted container logs its lines again.
    wait_for_logs(&d, &id, |l| l.iter().filter(|l| l.line == "out foo-value").count() == 2).await;

    d.remove(&id).await.expect("remove kills and removes");
    assert!(matches!(d.inspect(&id).await, Err(RuntimeError::NotFound(_))));
    assert!(d.list(&labels_of(&spec)).await.expect("list").is_empty());
    d.remove(&id).await.expect("removing twice is fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_logs_delivers_lines_written_after_subscribing() {
    let d = docker();
    let trigger = std::env::temp_dir().join(format!("gantry-rt-follow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&trigger);
    std::fs::create_dir_all(&trigger).expect("trigger dir");
    let mut spec = busybox(
        "follow",
        "echo early; while [ ! -e /trigger/go ]; do sleep 0.1; done; echo late; echo late-err >&2; sleep 0.5",
    );
    spec.binds = vec![format!("{}:/trigger:ro", trigger.display())];
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");

    let mut lines = d.follow_logs(&id, None, None);
    let first = next_within(&mut lines).await.expect("stream open").expect("line");
    assert_eq!((first.stream, first.line.as_str()), (LogStream::Stdout, "early"));

    // Only now does the container print more.
    tokio::fs::write(trigger.join("go"), b"").await.expect("trigger");
    let mut rest = Vec::new();
    while let Some(item) = next_within(&mut lines).await {
        rest.push(item.expect("line"));
    }
    // ...and the stream ended by itself when the container exited.
    let got: Vec<_> = rest.iter().map(|l| (l.stream, l.line.as_str())).collect();
    assert!(
        got.contains(&(LogStream::Stdout, "late")) && got.contains(&(LogStream::Stderr, "late-err")),
        "{got:?}"
    );
    assert!(first.ts_unix_nanos <= rest[0].ts_unix_nanos);
    let _ = std::fs::remove_dir_all(&trigger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_followed_stream_of_a_running_container_ends_it() {
    let d = docker();
    let spec = busybox(
        "follow-drop",
        "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done",
    );
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");
    let mut lines = d.follow_logs(&id, Some(0), None);
    for _ in 0..3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .expect("tick")
            .expect("open");
        assert!(line.expect("line").line.starts_with("tick "));
    }
    drop(lines);
    // The client is still usable afterwards (the followed connection was not returned to the pool).
    d.remove(&id).await.expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tty_output_is_read_without_framing() {
    let d = docker();
    let mut spec = busybox("tty", "echo tty out; echo tty err >&2; sleep 1");
    spec.tty = true;
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");
    let lines = wait_for_logs(&d, &id, |l| l.len() >= 2).await;
    let got: Vec<_> = lines.iter().map(|l| (l.stream, l.line.as_str())).collect();
    assert_eq!(got, [(LogStream::Stdout, "tty out"), (LogStream::Stdout, "tty err")]);
    assert!(lines.iter().all(|l| l.ts_unix_nanos > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_name_is_a_conflict() {
    let d = docker();
    let spec = busybox("conflict", "exec sleep 300");
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");
    match d.run(&spec).await {
        Err(RuntimeError::Conflict(message)) => assert!(message.contains(&spec.name), "{message}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // The first container is untouched.
    assert_eq!(d.inspect(&spec.name).await.expect("inspect").id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_containers_are_not_found_or_fine() {
    let d = docker();
    let missing = format!("gantry-rt-missing-{}", std::process::id());
    d.remove(&missing).await.expect("removing a missing container is fine");
    d.stop(&missing, Duration::from_secs(1))
        .await
        .expect("stopping a missing container is fine");
    assert!(matches!(d.inspect(&missing).await, Err(RuntimeError::NotFound(_))));
    assert!(matches!(d.start(&missing).await, Err(RuntimeError::NotFound(_))));
    assert!(matches!(
        d.logs(&missing, None, None).await,
        Err(RuntimeError::NotFound(_))
    ));
    let mut followed = d.follow_logs(&missing, None, None);
    assert!(matches!(followed.next().await, Some(Err(RuntimeError::NotFound(_)))));
    assert!(followed.next().await.is_none(), "the stream ends after its error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_present_missing_and_unpullable() {
    let d = docker();
    let t0 = std::time::Instant::now();
    d.ensure_image(BUSYBOX, None)
        .await
        .expect("a present image needs no pull");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // A registry that refuses connections: the pull fails without any traffic leaving the machine.
    let image = "127.0.0.1:1/gantry-test/missing:1";
    match d.ensure_image(image, None).await {
        Err(RuntimeError::Pull(message)) => assert!(message.contains(image), "{message}"),
        other => panic!("expected a pull error, got {other:?}"),
    }
    let auth = RegistryAuth {
        username: "u".into(),
        password: "p".into(),
        server: "127.0.0.1:1".into(),
    };
    assert!(matches!(
        d.ensure_image(image, Some(&auth)).await,
        Err(RuntimeError::Pull(_))
    ));

    // Running an image that is not there is NotFound (no implicit pull) and leaves no container.
    let mut spec = busybox("no-image", "true");
    spec.image = "gantry-test/not-imported:1".into();
    let _cleanup = Cleanup(spec.name.clone());
    assert!(matches!(d.run(&spec).await, Err(RuntimeError::NotFound(_))));
    assert!(d.list(&labels_of(&spec)).await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_apply_and_auto_remove_removes() {
    let d = docker();
    let mut spec = busybox(
        "limits",
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; sleep 300",
    );
    spec.memory_bytes = Some(64 << 20);
    spec.nano_cpus = Some(500_000_000);
    spec.stop_timeout_secs = Some(1);
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");
    let lines = wait_for_logs(&d, &id, |l| !l.is_empty()).await;
    assert_eq!(lines[0].line, (64u64 << 20).to_string());
    d.remove(&id).await.expect("remove");

    let mut spec = busybox("auto-remove", "true");
    spec.auto_remove = true;
    let _cleanup = Cleanup(spec.name.clone());
    let id = d.run(&spec).await.expect("run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match d.inspect(&id).await {
            Err(RuntimeError::NotFound(_)) => break,
            Ok(c) => assert!(tokio::time::Instant::now() < deadline, "never auto-removed: {c:?}"),
            Err(e) => panic!("inspect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_cannot_start_is_not_left_behind() {
    let d = docker();
    let mut spec = busybox("gpu", "true");
    spec.gpus = 1;
    let _cleanup = Cleanup(spec.name.clone());
    match d.run(&spec).await {
        // The usual case here: no NVIDIA container toolkit, so the engine cannot satisfy the request.
        Err(RuntimeError::Engine { status, message }) => {
            eprintln!("GPU request refused as expected without the NVIDIA runtime: {status} {message}");
            assert!(
                d.list(&labels_of(&spec)).await.expect("list").is_empty(),
                "run must clean up"
            );
            assert!(matches!(d.inspect(&spec.name).await, Err(RuntimeError::NotFound(_))));
        }
        // An engine with the NVIDIA runtime starts it.
        Ok(id) => {
            eprintln!("this engine has a GPU runtime; the container started");
            d.remove(&id).await.expect("remove");
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runpod_worker_image_runs_its_handler() {
    // runpod-python's local test mode: one job from --test_input, then exit, no network.
    let d = docker();
    let mut spec = busybox("runpod", "");
    spec.image = "gantry-test/runpod-worker:1".into();
    spec.cmd = Some(vec![
        "python".into(),
        "-u".into(),
        "/opt/handlers/echo.py".into(),
        "--test_input".into(),
        r#"{"input": {"x": 41}}"#.into(),
    ]);
    let _cleanup = Cleanup(spec.name.clone());
    d.ensure_image(&spec.image, None)
        .await
        .expect("imported by scripts/test-docker.sh start");
    let id = d.run(&spec).await.expect("run");
    let mut all = Vec::new();
    let mut lines = d.follow_logs(&id, None, None);
    while let Some(line) = next_within(&mut lines).await {
        all.push(line.expect("line").line);
    }
    assert!(all.iter().any(|l| l.contains("'echo': {'x': 41}")), "{all:#?}");
    // The stream ends when the container stops; its state may take a moment to say so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let c = d.inspect(&id).await.expect("inspect");
        if c.state != ContainerState::Running || tokio::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((done.state, done.exit_code), (ContainerState::Exited, Some(0)));
}

#[tokio::test]
async fn unreachable_engines_are_unavailable() {
    let socket = "unix:///nonexistent/gantry/docker.sock";
    let d = Docker::connect(socket).expect("parses");
    match d.negotiate().await {
        Err(RuntimeError::Unavailable(message)) => {
            assert!(
                message.starts_with(&format!("no container engine at {socket}")),
                "{message}"
            );
            assert!(message.contains("No such file"), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Every operation says the same, since it negotiates first.
    assert!(matches!(d.list(&[]).await, Err(RuntimeError::Unavailable(_))));
    assert!(matches!(d.remove("x").await, Err(RuntimeError::Unavailable(_))));

    let refused = Docker::connect("tcp://127.0.0.1:1").expect("parses");
    match refused.info().await {
        Err(RuntimeError::Unavailable(message)) => assert!(message.contains("tcp://127.0.0.1:1"), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        Docker::connect("ssh://host"),
        Err(RuntimeError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_silent_engine_times_out_as_unavailable() {
    // A listener that accepts and never answers, standing in for a hung engine.
    let dir = std::env::temp_dir().join(format!("gantry-rt-silent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("silent.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let d = Docker::connect(&format!("unix://{}", path.display()))
        .expect("parses")
        .with_request_timeout(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    match d.negotiate().await {
        Err(RuntimeError::Unavailable(message)) => assert!(message.contains("no answer within"), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    hold.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn from_env_uses_docker_host() {
    // Only meaningful where DOCKER_HOST is set, which these tests require anyway.
    let d = Docker::from_env().expect("from_env");
    assert_eq!(d.endpoint(), docker_host().trim().trim_end_matches('/'));
}
