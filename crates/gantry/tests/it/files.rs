//! Output files: stored by the scheduler as a worker streams them, read by
//! expiring URLs (signed by Gantry on local disk, presigned on S3), swept
//! after their lifetime, and never kept for a job whose result did not commit.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::harness::{Backend, TestApp, problem};

gantry_testkit::on_both_backends!(
    a_file_url_works_until_it_expires_and_refuses_tampering,
    files_of_a_failed_job_are_deleted_and_cost_nothing,
    kept_files_are_charged_with_their_job,
);

/// The files under the local store's directory.
fn stored(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl TestApp {
    /// An echo `runsync` job with an output file; the finished job, whatever
    /// its status.
    pub(crate) async fn echo_file_job(&self, key: &str, file: Value) -> Value {
        let res = self.submit("runsync", key, json!({"input": {"file": file}})).await;
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }

    /// [`Self::echo_file_job`], which must complete.
    async fn echo_file(&self, key: &str, file: Value) -> Value {
        let body = self.echo_file_job(key, file).await;
        assert_eq!(body["status"], "COMPLETED", "{body}");
        body
    }

    fn files_dir(&self) -> PathBuf {
        self.settings.data_dir.join("files")
    }
}

/// `url` with query parameter `name` set to `value`.
fn with_param(url: &str, name: &str, value: &str) -> String {
    let mut parsed = reqwest::Url::parse(url).unwrap();
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .map(|(k, v)| {
            if k == name {
                (k.into_owned(), value.to_owned())
            } else {
                (k.into_owned(), v.into_owned())
            }
        })
        .collect();
    parsed.query_pairs_mut().clear().extend_pairs(pairs);
    parsed.to_string()
}

async fn a_file_url_works_until_it_expires_and_refuses_tampering(backend: Backend) {
    let app = TestApp::spawn_with(backend, |s| s.files.lifetime_secs = 10).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let body = app
        .echo_file(
            &key,
            json!({"text": "hello world ", "repeat": 1000, "media_type": "audio/wav"}),
        )
        .await;
    let url = body["output"]["file_url"].as_str().expect("file_url").to_owned();
    assert!(url.starts_with(&format!("{}/files/jobs/", app.public_base)), "{url}");
    // The input is echoed alongside; the cost stays.
    assert_eq!(body["output"]["file"]["repeat"], 1000);
    assert!(body["output"]["cost"].is_number(), "{body}");

    // The whole file, with its media type and length; no API key needed.
    let res = app.client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "audio/wav");
    assert_eq!(res.headers()["content-length"], "12000");
    assert_eq!(res.headers()["accept-ranges"], "bytes");
    let bytes = res.bytes().await.unwrap();
    assert_eq!(bytes.len(), 12_000);
    assert_eq!(&bytes[..12], b"hello world ");

    // HEAD: the same headers, no body.
    let res = app.client.head(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], "12000");

    // Ranges: a slice, an open end, a suffix; past the end is 416.
    for (range, expected, content_range) in [
        ("bytes=6-10", &b"world"[..], "bytes 6-10/12000"),
        ("bytes=11994-", &b"world "[..], "bytes 11994-11999/12000"),
        ("bytes=-3", &b"ld "[..], "bytes 11997-11999/12000"),
    ] {
        let res = app.client.get(&url).header("range", range).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(res.headers()["content-range"], content_range);
        assert_eq!(res.headers()["content-length"], expected.len().to_string().as_str());
        assert_eq!(&res.bytes().await.unwrap()[..], expected, "{range}");
    }
    let res = app
        .client
        .get(&url)
        .header("range", "bytes=12000-")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["content-range"], "bytes */12000");
    problem(res, 416).await;

    // Any change to what is signed is refused, as is an unsigned URL.
    let parsed = reqwest::Url::parse(&url).unwrap();
    let sig: String = parsed.query_pairs().find(|(k, _)| k == "sig").unwrap().1.into_owned();
    let expires: i64 = parsed
        .query_pairs()
        .find(|(k, _)| k == "expires")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let flipped = format!("{}{}", if sig.starts_with('0') { "1" } else { "0" }, &sig[1..]);
    let other_file = url.replacen("/0.wav?", "/1.wav?", 1);
    for tampered in [
        with_param(&url, "sig", &flipped),
        with_param(&url, "type", "text/html"),
        with_param(&url, "expires", &(expires + 3600).to_string()),
        other_file,
        url.split('?').next().unwrap().to_owned(),
    ] {
        let res = app.client.get(&tampered).send().await.unwrap();
        let body = problem(res, 403).await;
        assert!(body["detail"].as_str().unwrap().contains("URL"), "{body}");
    }

    // After its lifetime the URL is refused, and the sweeper deletes the
    // file and its row.
    let wait = u64::try_from(expires * 1000 - now_ms()).unwrap_or(0) + 200;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let body = problem(app.client.get(&url).send().await.unwrap(), 403).await;
    assert!(body["detail"].as_str().unwrap().contains("expired"), "{body}");
    let dir = app.files_dir();
    eventually("the expired file is deleted", async || stored(&dir).is_empty()).await;
    eventually("its row is deleted", async || {
        app.count("SELECT COUNT(*) FROM files").await == 0
    })
    .await;
}

/// A job's files stay until their URLs expire (7 days here): the job's
/// charge is the model's price plus that stay at the output-file storage
/// price (0.07 USD per GB-month), in its one ledger entry.
async fn kept_files_are_charged_with_their_job(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // 3,000,000 bytes for 168 h of 730: 48.33 µUSD, beside echo's 10 µUSD.
    let body = app
        .echo_file(&key, json!({"text": "0123456789", "repeat": 300_000}))
        .await;
    assert_eq!(body["output"]["cost"], json!(0.000058), "{body}");
    let id = body["id"].as_str().unwrap();
    let charged = format!("SELECT amount_micro_usd FROM ledger_entries WHERE job_id = '{id}'");
    assert_eq!(app.count(&charged).await, 58);
    // A few bytes cost nothing more than the job.
    let body = app.echo_file(&key, json!({"text": "small"})).await;
    assert_eq!(body["output"]["cost"], json!(0.00001), "{body}");
    // A job without files costs its price.
    let res = app.submit("runsync", &key, json!({"input": {"n": 1}})).await;
    assert_eq!(res.json::<Value>().await.unwrap()["output"]["cost"], json!(0.00001));
    assert_eq!(
        app.count("SELECT CAST(COALESCE(SUM(amount_micro_usd), 0) AS BIGINT) FROM ledger_entries")
            .await,
        78
    );
}

async fn files_of_a_failed_job_are_deleted_and_cost_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    let res = app
        .submit(
            "runsync",
            &key,
            json!({"input": {"file": {"text": "lost", "repeat": 10}, "fail": "after the file"}}),
        )
        .await;
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "FAILED", "{body}");
    assert!(body["output"].is_null(), "{body}");
    let dir = app.files_dir();
    eventually("the failed job's file is deleted", async || stored(&dir).is_empty()).await;
    assert_eq!(app.count("SELECT COUNT(*) FROM files").await, 0);
    assert_eq!(app.count("SELECT COUNT(*) FROM ledger_entries").await, 0);

    // A completed one keeps its file, and its row says whose it is.
    let body = app.echo_file(&key, json!({"text": "kept"})).await;
    let url = body["output"]["file_url"].as_str().unwrap();
    let res = app.client.get(url).send().await.unwrap();
    assert_eq!(res.headers()["content-type"], "text/plain");
    assert_eq!(res.text().await.unwrap(), "kept");
    assert_eq!(stored(&dir).len(), 1);
    assert_eq!(app.count("SELECT COUNT(*) FROM files WHERE size = 4").await, 1);

    // The job read later gets a URL again (computed at read time).
    let id = body["id"].as_str().unwrap();
    let status = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
        .await;
    let again = status["output"]["file_url"].as_str().unwrap();
    assert_eq!(
        app.client.get(again).send().await.unwrap().text().await.unwrap(),
        "kept"
    );
}

#[tokio::test]
async fn a_large_file_travels_in_chunks_and_unreferenced_objects_are_swept() {
    let app = TestApp::spawn_with(Backend::Sqlite, |s| s.files.orphan_grace_secs = 2).await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // 20 MiB: twenty 1 MiB chunks on the worker stream, a multipart upload.
    let text = "0123456789abcdef";
    let repeat = 20 * 1024 * 1024 / text.len();
    let body = app.echo_file(&key, json!({"text": text, "repeat": repeat})).await;
    let url = body["output"]["file_url"].as_str().unwrap();
    let res = app.client.get(url).send().await.unwrap();
    assert_eq!(res.headers()["content-length"], (20 * 1024 * 1024).to_string().as_str());
    let bytes = res.bytes().await.unwrap();
    let expected = Sha256::digest(text.repeat(repeat).as_bytes());
    assert_eq!(Sha256::digest(&bytes), expected);

    // An object no committed result references (as a crash between storing
    // and settling leaves) is deleted after the grace period; the file of
    // the completed job stays.
    let orphan = app.files_dir().join("jobs/job-that-never-committed/1/0.txt");
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, "orphan").unwrap();
    eventually("the orphan is deleted", async || !orphan.exists()).await;
    assert_eq!(stored(&app.files_dir()).len(), 1);
    assert_eq!(app.client.get(url).send().await.unwrap().status(), 200);
}

/// A moto S3 server on a free port, stopped on drop.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Moto {
    async fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto starts (pip install 'moto[server]')");
        let endpoint = format!("http://127.0.0.1:{port}");
        let client = crate::harness::http_client(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if client.get(format!("{endpoint}/moto-api/")).send().await.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "moto did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Moto { child, endpoint }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn s3_files_are_presigned_urls_that_expire() {
    let moto = Moto::start().await;
    let client = crate::harness::http_client(Duration::from_secs(30));
    // moto's default region: a bucket is created by a PUT on its name.
    let res = client
        .put(format!("{}/gantry-files", moto.endpoint))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "bucket: {}", res.status());
    let endpoint = moto.endpoint.clone();
    let app = TestApp::spawn_with(Backend::Sqlite, move |s| {
        s.files.backend = gantry_files::Backend::S3;
        // Long enough that the 9 MiB upload and the first read, on a busy
        // machine, leave whole seconds of it for the second read to see shrink.
        s.files.lifetime_secs = 6;
        s.files.s3.bucket = "gantry-files".into();
        s.files.s3.endpoint = Some(endpoint);
        s.files.s3.allow_http = true;
        s.files.s3.access_key_id = Some("testing".into());
        s.files.s3.secret_access_key = Some("testing".into());
    })
    .await;
    let (_, key) = app.user_with_key("endpoints:run").await;
    // Above the multipart threshold (8 MiB): uploaded in parts.
    let text = "s3 round trip. ";
    let repeat = 9 * 1024 * 1024 / text.len();
    let body = app
        .echo_file(&key, json!({"text": text, "repeat": repeat, "media_type": "video/mp4"}))
        .await;
    let url = body["output"]["file_url"].as_str().unwrap().to_owned();
    assert!(
        url.starts_with(&format!("{}/gantry-files/jobs/", moto.endpoint)),
        "{url}"
    );
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "video/mp4");
    let bytes = res.bytes().await.unwrap();
    assert_eq!(Sha256::digest(&bytes), Sha256::digest(text.repeat(repeat).as_bytes()));
    // A ranged read through the presigned URL.
    let res = client.get(&url).header("range", "bytes=0-1").send().await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(&res.bytes().await.unwrap()[..], b"s3");

    // The signature ends where the file's lifetime does: X-Amz-Date plus
    // X-Amz-Expires is the file's creation plus 6 s, whenever the job is
    // read (a later read gets a shorter presigned lifetime, never a longer
    // one). moto does not enforce presigned expiry itself (AWS does); the
    // sweeper deleting the object at expiry makes the URL dead on any store.
    let presigned_end = |url: &str| {
        let parsed = reqwest::Url::parse(url).unwrap();
        let param = |name: &str| parsed.query_pairs().find(|(k, _)| k == name).unwrap().1.into_owned();
        let expires: i64 = param("X-Amz-Expires").parse().unwrap();
        (signed_at(&param("X-Amz-Date")) + expires, expires)
    };
    let (end, first_expires) = presigned_end(&url);
    assert!((2..=6).contains(&first_expires), "X-Amz-Expires {first_expires}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let id = body["id"].as_str().unwrap();
    let status = app
        .public_ok(Method::GET, &format!("/v2/gantry-echo/status/{id}"), &key)
        .await;
    let again = status["output"]["file_url"].as_str().unwrap();
    let (end_again, expires_again) = presigned_end(again);
    assert!(expires_again < first_expires, "{expires_again} < {first_expires}");
    assert!((end_again - end).abs() <= 1, "{end_again} vs {end}");

    // Past the lifetime the sweeper deletes the object: the URL answers 404.
    eventually("the expired object is deleted", async || {
        client.get(&url).send().await.unwrap().status() == 404
    })
    .await;
    assert!(now_ms() / 1000 >= end - 1, "deleted before its lifetime ended");
}

/// Unix seconds of an `X-Amz-Date` (`20261124T051500Z`).
fn signed_at(amz_date: &str) -> i64 {
    let n = |range: std::ops::Range<usize>| -> i64 { amz_date[range].parse().unwrap() };
    let (year, month, day) = (n(0..4), n(4..6), n(6..8));
    let (hour, minute, second) = (n(9..11), n(11..13), n(13..15));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hour * 3600 + minute * 60 + second
}

impl TestApp {
    /// `SELECT COUNT(*) …` against the app's database.
    pub async fn count(&self, sql: &str) -> i64 {
        use sea_orm::{ConnectionTrait, Database, Statement};
        let db = Database::connect(&self.database_url).await.unwrap();
        let backend = db.get_database_backend();
        let row = db
            .query_one_raw(Statement::from_string(backend, sql.to_owned()))
            .await
            .unwrap()
            .unwrap();
        let n: i64 = row.try_get_by_index(0).unwrap();
        db.close().await.ok();
        n
    }
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}
