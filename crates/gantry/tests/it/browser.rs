//! The web console in a real browser: headless Chromium, driven through
//! WebDriver (Debian's `chromium-driver`, with the Selenium client) by
//! `tests/browser/console.py`, against a real `gantry serve` with the text,
//! speech, speech-to-text, image and video models, and pods on the private
//! Docker engine of the tests. axe-core (from npm, `~/.cache/gantry/axe`) runs
//! on every page. `.ci/run` installs all of it.
//!
//! `GANTRY_CONSOLE_SCREENSHOTS=<dir>` keeps the screenshots the run takes
//! (`docs/console.md` shows them).
use std::path::PathBuf;
use std::process::Command;

use crate::cli::ServeProcess;
use crate::text::models_dir;

fn axe_js() -> PathBuf {
    match std::env::var_os("GANTRY_TEST_AXE_JS") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/gantry/axe/node_modules/axe-core/axe.min.js"),
    }
}

#[test]
fn every_console_flow_in_headless_chromium() {
    let axe = axe_js();
    assert!(
        axe.exists(),
        "axe-core is missing at {} (scripts/test installs it: npm install --prefix ~/.cache/gantry/axe axe-core@4)",
        axe.display()
    );
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing (apt-get install chromium chromium-driver)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let models = models_dir();
    let docker = crate::serverless::docker_host();
    let serve = ServeProcess::start_with(
        dir.path(),
        &[
            // Pods run on the private test engine.
            ("GANTRY_SERVERLESS__DOCKER_HOST", docker.as_str()),
            ("GANTRY_SERVERLESS__TICK_MS", "200"),
            (
                "GANTRY_SCHEDULER__BUNDLED_WORKERS",
                "[gantry-echo, smollm2-135m-instruct, piper-en-us-joe, dcgan-faces-64, whisper-tiny-en, faces-morph-video]",
            ),
            ("GANTRY_MODELS_DIR", models.to_str().unwrap()),
            ("GANTRY_TEXT__THREADS", "1"),
            ("GANTRY_TEXT__CONTEXT_TOKENS", "4096"),
            // Every token its own chunk: the page must show them arrive.
            ("GANTRY_TEXT__STREAM_INTERVAL_MS", "0"),
        ],
    );
    let password = serve.admin_password().expect("serve printed the console password");
    let shots = std::env::var("GANTRY_CONSOLE_SCREENSHOTS")
        .unwrap_or_else(|_| dir.path().join("screenshots").display().to_string());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.py");
    let out = Command::new("python3")
        .arg(script)
        .env("CONSOLE_URL", format!("http://{}", serve.management))
        .env("EMAIL", "admin@localhost")
        .env("PASSWORD", &password)
        .env("AXE_JS", &axe)
        .env("SCREENSHOTS", &shots)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("CONSOLE-BROWSER-OK"),
        "the browser run failed:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains(&password) && !stderr.contains(&password));
    drop(serve);
}
