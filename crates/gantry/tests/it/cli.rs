use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Backend, TestApp, problem};

/// Runs the real `gantry` binary against the test app's database.
pub fn gantry(app: &TestApp, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(args)
        .env("GANTRY_DATABASE_URL", &app.database_url)
        .env("GANTRY_DATA_DIR", &app.settings.data_dir)
        .env("GANTRY_LOG", "warn")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run gantry")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "gantry failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

gantry_testkit::on_both_backends!(users_and_keys_from_the_command_line);

async fn users_and_keys_from_the_command_line(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    stdout(&gantry(&app, &["users", "create", "Ops@Example.test"]));
    let dup = gantry(&app, &["users", "create", "ops@example.test"]);
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));

    let out = stdout(&gantry(
        &app,
        &[
            "keys",
            "create",
            "--user",
            "ops@example.test",
            "--scopes",
            "read-only",
            "--expires-in",
            "30d",
        ],
    ));
    let key = out.trim_end();
    assert_eq!(out.lines().count(), 1, "only the key on stdout: {out:?}");
    assert!(key.starts_with("gk_") && key.len() == 41, "{key}");
    assert_eq!(app.get("/v2/network-volumes", key).await.status(), 200);
    problem(
        app.send_json(
            reqwest::Method::POST,
            "/v2/network-volumes",
            key,
            &serde_json::json!({}),
        )
        .await,
        403,
    )
    .await;

    let listing = stdout(&gantry(&app, &["keys", "list", "--user", "ops@example.test"]));
    assert!(!listing.contains(key), "the secret is never listed");
    let row = listing.lines().nth(1).expect("one key row");
    assert!(
        row.contains(&format!("{}…{}", &key[..7], &key[key.len() - 4..])),
        "{row}"
    );
    assert!(
        row.contains("active") && row.contains("volumes:read catalog:read billing:read"),
        "{row}"
    );
    let key_id = row.split_whitespace().next().unwrap().to_string();

    stdout(&gantry(&app, &["keys", "revoke", &key_id]));
    let listing = stdout(&gantry(&app, &["keys", "list", "--user", "ops@example.test"]));
    assert!(listing.lines().nth(1).unwrap().contains("revoked"));

    for bad in [
        vec![
            "keys",
            "create",
            "--user",
            "ops@example.test",
            "--scopes",
            "volumes:destroy",
        ],
        vec!["keys", "create", "--user", "nobody@example.test", "--scopes", "all"],
        vec![
            "keys",
            "create",
            "--user",
            "ops@example.test",
            "--scopes",
            "all",
            "--expires-in",
            "soon",
        ],
        vec!["keys", "revoke", "key_doesnotexist"],
    ] {
        let out = gantry(&app, &bad);
        assert!(!out.status.success(), "{bad:?} should fail");
        assert!(out.stdout.is_empty(), "nothing on stdout for a failure");
    }
}

/// A real `gantry serve` process on its own data dir and free ports.
pub(crate) struct ServeProcess {
    pub(crate) child: std::process::Child,
    pub(crate) management: String,
    public: String,
    /// Worker threads of its async runtime, as it logged them.
    runtime_threads: usize,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl ServeProcess {
    fn start(dir: &std::path::Path) -> ServeProcess {
        Self::start_with(dir, &[])
    }

    /// Starts with extra environment variables.
    pub(crate) fn start_with(dir: &std::path::Path, env: &[(&str, &str)]) -> ServeProcess {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .arg("serve")
            .env("GANTRY_SCHEDULER__BUNDLED_WORKERS", "[gantry-echo]")
            .envs(env.iter().copied())
            .env("GANTRY_DATA_DIR", dir)
            .env("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0")
            .env("GANTRY_PUBLIC_ADDR", "127.0.0.1:0")
            .env("GANTRY_SCHEDULER__ADDR", "127.0.0.1:0")
            .env("GANTRY_HTTP__WORKERS", "1")
            .env_remove("GANTRY_DATABASE_URL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Everything printed on stdout is kept; the log is drained so the server never blocks.
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stdout.take().unwrap();
        let sink = stdout.clone();
        let out_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                *sink.lock().unwrap() = text.clone();
            }
        });
        // The log line naming the listeners says it is up.
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut addrs = None;
        for line in stderr.by_ref() {
            let line = line.unwrap();
            let field = |name: &str| {
                line.find(name)
                    .and_then(|at| line[at + name.len()..].split_whitespace().next().map(String::from))
            };
            if let (Some(management), Some(public), Some(threads)) =
                (field("management="), field("public="), field("runtime_threads="))
            {
                addrs = Some((management, public, threads.parse().expect("runtime_threads")));
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "serve did not start");
        }
        let (management, public, runtime_threads) = addrs.expect("serve logged its addresses");
        let log_reader = std::thread::spawn(move || {
            stderr.for_each(drop);
        });
        ServeProcess {
            child,
            management,
            public,
            runtime_threads,
            stdout,
            readers: vec![out_reader, log_reader],
        }
    }

    /// The admin key printed on a first start.
    pub(crate) fn admin_key(&self) -> Option<String> {
        let started = Instant::now();
        loop {
            let out = self.stdout.lock().unwrap().clone();
            if let Some(key) = out.split_whitespace().find(|w| w.starts_with("gk_")) {
                return Some(key.to_string());
            }
            if started.elapsed() > Duration::from_secs(2) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The console password printed with the admin key on a first start.
    pub(crate) fn admin_password(&self) -> Option<String> {
        self.admin_key()?;
        let out = self.stdout.lock().unwrap().clone();
        let after = out.split("with this password").nth(1)?;
        after
            .lines()
            .skip(1)
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(String::from)
    }

    /// SIGTERM, a graceful exit with status 0, and everything it printed on stdout.
    fn stop(mut self) -> String {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "graceful shutdown exits 0");
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        self.stdout.lock().unwrap().clone()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gantry serve` on a fresh data dir: prints one admin key on the first start only.
#[test]
fn first_start_prints_one_admin_key_and_later_starts_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let first = ServeProcess::start(dir.path());
    assert!(first.management.starts_with("127.0.0.1:"));
    let first = first.stop();
    let keys: Vec<&str> = first.split_whitespace().filter(|w| w.starts_with("gk_")).collect();
    assert_eq!(keys.len(), 1, "one key on first start: {first}");
    assert!(first.contains("admin@localhost"));
    let second = ServeProcess::start(dir.path()).stop();
    assert!(!second.contains("gk_"), "no key on later starts: {second}");
    assert!(dir.path().join("gantry.db").exists(), "SQLite under the data dir");
}

/// `runtime_threads` sizes the async runtime: half the cores (rounded up) by
/// default, since the HTTP listeners already run a thread per core, or the
/// configured number.
#[test]
fn serve_sizes_its_async_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    let default = ServeProcess::start(dir.path());
    assert_eq!(default.runtime_threads, cores.div_ceil(2));
    default.stop();
    let configured = ServeProcess::start_with(dir.path(), &[("GANTRY_RUNTIME_THREADS", "3")]);
    assert_eq!(configured.runtime_threads, 3);
    configured.stop();
}

/// Two platforms on one machine, each with its own listeners, scheduler and workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_instances_run_side_by_side() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (ServeProcess::start(a_dir.path()), ServeProcess::start(b_dir.path()));
    let client = crate::harness::http_client(std::time::Duration::from_secs(30));
    for server in [&a, &b] {
        let key = server.admin_key().expect("admin key on first start");
        let job: serde_json::Value = client
            .post(format!("http://{}/v2/gantry-echo/runsync", server.public))
            .bearer_auth(&key)
            .json(&serde_json::json!({"input": {"from": server.public}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(job["status"], "COMPLETED", "{job}");
        assert_eq!(job["output"]["from"], server.public.as_str());
    }
    assert_ne!(a.public, b.public);
    a.stop();
    b.stop();
}

/// Two serving processes on one SQLite file would each trust their own caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_sqlite_file_refuses_to_start() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let stderr = serve_fails(serve_on_free_ports(&app.settings.data_dir).env("GANTRY_DATABASE_URL", &app.database_url));
    assert!(
        stderr.contains("another Gantry process is serving the SQLite database"),
        "{stderr}"
    );
    // The first one is unaffected.
    let (_, key) = app.user_with_key("volumes:read").await;
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
}

/// The Kubernetes runtime refuses to start where its worker Pods could not
/// reach it, or where it does not know its API server, and says what to set.
#[test]
fn the_kubernetes_runtime_says_what_is_missing_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = serve_fails(
        serve_on_free_ports(dir.path())
            .env("GANTRY_SERVERLESS__RUNTIME", "kubernetes")
            .env_remove("KUBERNETES_SERVICE_HOST"),
    );
    assert!(stderr.contains("serverless.kubernetes.server is unset"), "{stderr}");
    let stderr = serve_fails(
        serve_on_free_ports(dir.path())
            .env("GANTRY_SERVERLESS__RUNTIME", "kubernetes")
            .env("GANTRY_SERVERLESS__KUBERNETES__SERVER", "https://127.0.0.1:1")
            .env("GANTRY_SERVERLESS__NETWORK", "bridge"),
    );
    assert!(stderr.contains("set serverless.worker_base_url"), "{stderr}");
}

/// `gantry migrate` creates the schema on a fresh database and is idempotent.
#[test]
fn migrate_creates_the_schema_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_gantry"))
            .arg("migrate")
            .env("GANTRY_DATA_DIR", dir.path())
            .env_remove("GANTRY_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(dir.path().join("gantry.db").exists());
    assert!(run().status.success(), "running it again changes nothing and succeeds");
    // The schema is usable: the admin CLI works against it.
    let user = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["users", "create", "m@example.test"])
        .env("GANTRY_DATA_DIR", dir.path())
        .env_remove("GANTRY_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(user.status.success(), "{}", String::from_utf8_lossy(&user.stderr));
}

/// A `webhook_ca_file` that cannot be read stops `serve` at start, naming the
/// file, rather than leaving every `https://` webhook to fail later.
#[test]
fn serve_refuses_a_webhook_ca_file_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ca.pem");
    let stderr = serve_fails(
        serve_on_free_ports(dir.path())
            .env_remove("GANTRY_DATABASE_URL")
            .env("GANTRY_SCHEDULER__WEBHOOK_CA_FILE", &missing),
    );
    assert!(
        stderr.contains("webhook_ca_file") && stderr.contains("no-such-ca.pem"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("gantry.db").exists(),
        "refused before the database is created"
    );
}

/// `gantry serve` on `data_dir`, every listener on a free port.
fn serve_on_free_ports(data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
    command
        .arg("serve")
        .env("GANTRY_DATA_DIR", data_dir)
        .env("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0")
        .env("GANTRY_PUBLIC_ADDR", "127.0.0.1:0")
        .env("GANTRY_SCHEDULER__ADDR", "127.0.0.1:0")
        .env("GANTRY_SCHEDULER__BUNDLED_WORKERS", "[gantry-echo]")
        .stdin(Stdio::null());
    command
}

/// Runs `command`, which must fail; returns its stderr.
fn serve_fails(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn models_list_says_what_is_here_and_what_is_missing() {
    let empty = tempfile::tempdir().unwrap();
    let list = |dir: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["models", "list"])
            .env("GANTRY_MODELS_DIR", dir)
            .env("GANTRY_DATA_DIR", empty.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let line = |text: &str, id: &str| text.lines().find(|l| l.starts_with(id)).unwrap().to_string();
    let nothing = list(empty.path());
    let smollm = line(&nothing, "smollm2-135m-instruct");
    assert!(smollm.contains("10.00 per 1000000 tokens"), "{smollm}");
    assert!(smollm.contains("missing: SmolLM2-135M-Instruct.Q4_1.gguf"), "{smollm}");
    assert!(line(&nothing, "gantry-echo").ends_with("ready"));
    assert!(line(&nothing, "gemma-3-270m-it").contains("missing"));
    // The suite's weights directory holds the text model (the text tests fetch it).
    let cached = list(&crate::text::models_dir());
    if crate::text::models_dir().join("smollm2-135m-instruct").exists() {
        assert!(line(&cached, "smollm2-135m-instruct").ends_with("ready"), "{cached}");
    }
}

#[test]
fn serve_without_reachable_weights_serves_the_rest_and_says_how_to_fetch_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = serve_on_free_ports(dir.path())
        .env(
            "GANTRY_SCHEDULER__BUNDLED_WORKERS",
            "[gantry-echo, smollm2-135m-instruct]",
        )
        .env("GANTRY_MODELS_DIR", dir.path().join("models"))
        // A pip that fails at once, as an offline one does.
        .env("GANTRY_PIP", "false")
        .env("GANTRY_HTTP__WORKERS", "1")
        .env_remove("GANTRY_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut log = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let serving = line.contains("gantry is serving");
        log.push(line);
        if serving {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "serve did not start");
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = log.join("\n");
    assert!(log.contains("gantry is serving"), "it serves what it has:\n{log}");
    assert!(log.contains("not serving smollm2-135m-instruct"), "{log}");
    assert!(log.contains("gantry models pull smollm2-135m-instruct"), "{log}");
}

/// After a `kill -9` of `gantry serve`, the jobs it was running run again as
/// soon as the next process starts on the same SQLite file (whose lock proves
/// no other process holds them), not after their 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_killed_serve_left_running_run_again_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let client = crate::harness::http_client(Duration::from_secs(10));
    let first = ServeProcess::start(dir.path());
    let key = first.admin_key().expect("first start prints a key");
    let public = format!("http://{}", first.public);
    let job: serde_json::Value = client
        .post(format!("{public}/v2/gantry-echo/run"))
        .bearer_auth(&key)
        .json(&serde_json::json!({"input": {"sleep_ms": 2000}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let status = |public: String| {
        let (client, key, id) = (client.clone(), key.clone(), id.clone());
        async move {
            let job: serde_json::Value = client
                .get(format!("{public}/v2/gantry-echo/status/{id}"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            job["status"].as_str().unwrap().to_string()
        }
    };
    let started = Instant::now();
    while status(public.clone()).await != "IN_PROGRESS" {
        assert!(started.elapsed() < Duration::from_secs(10), "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(first); // SIGKILL
    let second = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || ServeProcess::start(&dir)
    })
    .await
    .unwrap();
    let restarted = Instant::now();
    let public = format!("http://{}", second.public);
    loop {
        let now = status(public.clone()).await;
        if now == "COMPLETED" {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "still {now} 20 s after the restart: it waited for the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `log_format = "json"`: every log line is one JSON object; and every
/// response carries its request id (the caller's, or a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = serve_on_free_ports(dir.path())
        .env("GANTRY_LOG_FORMAT", "json")
        .env("GANTRY_LOG", "info,gantry_api=debug")
        .env("GANTRY_HTTP__WORKERS", "1")
        .env_remove("GANTRY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut management = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        let entry: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(entry["timestamp"].is_string() && entry["level"].is_string(), "{line}");
        if entry["message"] == "gantry is serving" {
            management = entry["management"].as_str().map(str::to_string);
            break;
        }
    }
    let management = management.expect("serve logged its addresses");
    let client = crate::harness::http_client(Duration::from_secs(10));
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let echoed = client
        .get(format!("http://{management}/healthz"))
        .header("x-request-id", "req-42")
        .header("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "req-42");
    let fresh = client.get(format!("http://{management}/v2/nope")).send().await.unwrap();
    assert_eq!(fresh.status(), 404);
    let id = fresh.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "{id}");
    // The access log line of the first request names its request and its trace.
    let mut access = None;
    for line in lines.by_ref() {
        let entry: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if entry["fields"]["message"] == "request answered" || entry["message"] == "request answered" {
            let spans = entry["spans"].as_array().cloned().unwrap_or_default();
            if spans.iter().any(|s| s["request_id"] == "req-42") {
                access = Some(entry);
                break;
            }
        }
    }
    let access = access.expect("an access log line of the request");
    let span = access["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["request_id"] == "req-42")
        .unwrap()
        .clone();
    assert_eq!(span["trace_id"], trace, "{access}");
    let _ = child.kill();
    let _ = child.wait();
}

/// The binary links no espeak-ng: a server that serves no Piper voice (a
/// text-only GPU server) starts on a machine without it. The voices open
/// the library when they load (`crates/models/speech/src/phonemes.rs`).
#[test]
fn the_binary_needs_no_espeak_ng_to_start() {
    let output = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_gantry"))
        .output()
        .expect("run ldd");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let libraries = String::from_utf8_lossy(&output.stdout);
    assert!(libraries.contains("libc.so"), "ldd lists what it links: {libraries}");
    assert!(!libraries.contains("espeak"), "{libraries}");
}
