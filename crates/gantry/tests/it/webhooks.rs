//! Signed webhooks: a delivery verified by the Standard Webhooks reference
//! library (PyPI `standardwebhooks`), with the secret from
//! `gantry users webhook-secret`; a rotated secret signs what follows.
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::cli::gantry;
use crate::harness::{Backend, TestApp};

gantry_testkit::on_both_backends!(a_signed_webhook_is_verified_by_an_independent_implementation);

/// One HTTP request's headers (lower-case names) and body.
struct Received {
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// Answers every request 200 and forwards it.
async fn receiver() -> (String, tokio::sync::mpsc::Receiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let mut reader = BufReader::new(socket);
            let mut headers = HashMap::new();
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            loop {
                line.clear();
                reader.read_line(&mut line).await.unwrap();
                let trimmed = line.trim_end();
                if trimmed.is_empty() {
                    break;
                }
                if let Some((name, value)) = trimmed.split_once(':') {
                    headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
                }
            }
            let length: usize = headers.get("content-length").map_or(0, |v| v.parse().unwrap());
            let mut body = vec![0; length];
            reader.read_exact(&mut body).await.unwrap();
            let mut socket = reader.into_inner();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let _ = tx.send(Received { headers, body }).await;
        }
    });
    (url, rx)
}

/// Verifies a delivery with the reference library; returns its verdict.
fn verify_independently(secret: &str, received: &Received) -> Result<Value, String> {
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
request = json.load(sys.stdin)
try:
    payload = Webhook(request["secret"]).verify(request["body"].encode(), request["headers"])
    print(json.dumps({"ok": payload}))
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with standardwebhooks (pip install standardwebhooks)");
    let request = json!({
        "secret": secret,
        "body": String::from_utf8(received.body.clone()).unwrap(),
        "headers": received.headers,
    });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let verdict: Value = serde_json::from_slice(&output.stdout).unwrap();
    match verdict.get("ok") {
        Some(payload) => Ok(payload.clone()),
        None => Err(verdict["error"].as_str().unwrap_or_default().to_owned()),
    }
}

async fn a_signed_webhook_is_verified_by_an_independent_implementation(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (email, key) = app.user_with_key("endpoints:run").await;
    let (url, mut deliveries) = receiver().await;
    let secret = {
        let out = gantry(&app, &["users", "webhook-secret", &email]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert!(secret.starts_with("whsec_"), "{secret}");
    // Shown again: the same secret.
    let again = gantry(&app, &["users", "webhook-secret", &email]);
    assert_eq!(String::from_utf8(again.stdout).unwrap().trim(), secret);

    let next = async |deliveries: &mut tokio::sync::mpsc::Receiver<Received>| {
        tokio::time::timeout(Duration::from_secs(20), deliveries.recv())
            .await
            .expect("a delivery")
            .unwrap()
    };
    let res = app
        .submit("run", &key, json!({"input": {"hook": 1}, "webhook": url}))
        .await;
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let delivered = next(&mut deliveries).await;
    assert_eq!(delivered.headers["content-type"], "application/json");
    assert!(delivered.headers["webhook-id"].contains(&id));
    assert!(delivered.headers["webhook-signature"].starts_with("v1,"));
    let payload = verify_independently(&secret, &delivered).expect("the signature verifies");
    assert_eq!(payload["id"], id.as_str());
    assert_eq!(payload["status"], "COMPLETED");
    assert_eq!(payload["output"]["hook"], 1);

    // A changed body, or another secret, does not verify.
    let mut tampered = Received {
        headers: delivered.headers.clone(),
        body: delivered.body.clone(),
    };
    tampered.body.extend_from_slice(b" ");
    assert!(verify_independently(&secret, &tampered).is_err());
    let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(verify_independently(other, &delivered).is_err());

    // Rotated: the next delivery is signed with the new secret only.
    let out = gantry(&app, &["users", "webhook-secret", &email, "--rotate"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rotated = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_ne!(rotated, secret);
    app.submit("run", &key, json!({"input": {"hook": 2}, "webhook": url}))
        .await;
    let delivered = next(&mut deliveries).await;
    assert!(verify_independently(&rotated, &delivered).is_ok());
    assert!(verify_independently(&secret, &delivered).is_err());
}
