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

crate::on_both_backends!(users_and_keys_from_the_command_line);

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

/// `gantry serve` on a fresh data dir: prints one admin key on the first start only.
#[test]
fn first_start_prints_one_admin_key_and_later_starts_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .arg("serve")
            .env("GANTRY_DATA_DIR", dir.path())
            .env("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0")
            .env("GANTRY_PUBLIC_ADDR", "127.0.0.1:0")
            .env("GANTRY_HTTP__WORKERS", "1")
            .env_remove("GANTRY_DATABASE_URL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The log line naming the listeners says it is up.
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut management = None;
        for line in stderr.by_ref() {
            let line = line.unwrap();
            if let Some(at) = line.find("management=") {
                management = line[at + 11..].split_whitespace().next().map(String::from);
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "serve did not start");
        }
        let management = management.expect("serve logged its address");
        // Keep draining the log so the server never writes into a closed pipe.
        let drain = std::thread::spawn(move || stderr.count());
        // Shut it down gracefully, then read what it printed.
        std::process::Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "graceful shutdown exits 0");
        drain.join().unwrap();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        (management, out)
    };
    let (addr, first) = start();
    assert!(addr.starts_with("127.0.0.1:"));
    let keys: Vec<&str> = first.split_whitespace().filter(|w| w.starts_with("gk_")).collect();
    assert_eq!(keys.len(), 1, "one key on first start: {first}");
    assert!(first.contains("admin@localhost"));
    let (_, second) = start();
    assert!(!second.contains("gk_"), "no key on later starts: {second}");
    assert!(dir.path().join("gantry.db").exists(), "SQLite under the data dir");
}

/// Two serving processes on one SQLite file would each trust their own caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_sqlite_file_refuses_to_start() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let output = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .arg("serve")
        .env("GANTRY_DATABASE_URL", &app.database_url)
        .env("GANTRY_DATA_DIR", &app.settings.data_dir)
        .env("GANTRY_MANAGEMENT_ADDR", "127.0.0.1:0")
        .env("GANTRY_PUBLIC_ADDR", "127.0.0.1:0")
        .env("GANTRY_SCHEDULER__ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another Gantry process is serving the SQLite database"),
        "{stderr}"
    );
    // The first one is unaffected.
    let (_, key) = app.user_with_key("volumes:read").await;
    assert_eq!(app.get("/v2/network-volumes", &key).await.status(), 200);
}
