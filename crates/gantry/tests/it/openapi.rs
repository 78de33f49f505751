use std::collections::BTreeSet;

use serde_json::Value;

use crate::harness::{Backend, TestApp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_exactly_the_routes_that_exist() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let res = app
        .client
        .get(format!("{}/v2/openapi.json", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let doc: Value = res.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "OpenAPI 3.1");

    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "head", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let registered: BTreeSet<(String, String)> = gantry_api::management_endpoints()
        .iter()
        .map(|e| (e.method.to_string(), e.path.to_string()))
        .collect();
    assert_eq!(registered, documented, "every route is documented, and nothing else is");

    for endpoint in gantry_api::management_endpoints() {
        let op = &doc["paths"][endpoint.path][endpoint.method.as_str().to_lowercase()];
        if endpoint.authenticated {
            assert_eq!(
                op["security"],
                serde_json::json!([{"bearerAuth": []}]),
                "{}",
                endpoint.path
            );
            for status in ["401", "403", "500"] {
                let content = &op["responses"][status]["content"]["application/problem+json"];
                assert_eq!(
                    content["schema"]["$ref"], "#/components/schemas/ErrorResponse",
                    "{} {status}",
                    endpoint.path
                );
            }
        }
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearerAuth"]["scheme"], "bearer");

    // Field names and required members as the reference document has them.
    let schemas = &doc["components"]["schemas"];
    let required = |name: &str| -> BTreeSet<String> {
        schemas[name]["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        required("NetworkVolume"),
        ["dataCenter", "id", "name", "size", "type"].map(String::from).into()
    );
    assert_eq!(
        required("ErrorResponse"),
        ["detail", "errors", "status", "title"].map(String::from).into()
    );
    assert_eq!(
        required("DataCenter"),
        [
            "compliance",
            "globalNetwork",
            "id",
            "name",
            "networkVolumeTypes",
            "region"
        ]
        .map(String::from)
        .into()
    );
    let create = &doc["paths"]["/v2/network-volumes"]["post"];
    assert_eq!(
        create["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/CreateNetworkVolumeRequest"
    );
    assert_eq!(
        create["responses"]["422"]["content"]["application/problem+json"]["schema"]["$ref"],
        "#/components/schemas/ErrorResponse"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_listener_documents_its_own_routes() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let doc = app.document(&app.public_base).await;
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "head", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let registered: BTreeSet<(String, String)> = gantry_api::public_endpoints()
        .iter()
        .map(|e| (e.method.to_string(), e.path.to_string()))
        .collect();
    assert_eq!(registered, documented);
    let run = &doc["paths"]["/v2/{model_id}/run"]["post"];
    for status in ["401", "403", "404", "413", "422", "429"] {
        assert!(run["responses"].get(status).is_some(), "run documents {status}");
    }
    assert!(run["responses"]["429"]["headers"].get("Retry-After").is_some());
    let cancel = &doc["paths"]["/v2/{model_id}/cancel/{job_id}"]["post"];
    assert!(cancel["responses"].get("413").is_none(), "no body, no body errors");
}

/// Every model's input schema as served (made from its family's input type)
/// is a valid JSON Schema (draft 2020-12, which OpenAPI 3.1 uses), inputs the
/// models take are valid against it, and an unknown member is not (except
/// for echo, which takes any object). Checked by the `jsonschema` package, an
/// implementation independent of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_models_input_schema_is_a_valid_json_schema() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let doc = app.document(&app.public_base).await;
    let schemas: serde_json::Map<String, Value> = doc["components"]["schemas"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.starts_with("ModelInput."))
        .map(|(name, schema)| (name.clone(), schema.clone()))
        .collect();
    assert!(schemas.len() >= 12, "{:?}", schemas.keys());
    let accepted = serde_json::json!({
        "ModelInput.gantry-echo": [{"anything": [1, 2]}, {"stream": 3, "file": {"text": "a"}}],
        "ModelInput.smollm2-135m-instruct": [
            {"prompt": "Hi", "max_tokens": 8, "temperature": 0},
            {"messages": [{"role": "user", "content": "Hi"}], "stop": ["\n"], "response_format": {"type": "json_object"}}
        ],
        "ModelInput.gemma-3-270m-it": [{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20000}],
        "ModelInput.all-minilm-l6-v2": [{"input": "a"}, {"input": ["a", "b"], "encoding_format": "base64"}],
        "ModelInput.kokoro-hibari": [{"prompt": "Hello.", "voice": "heart", "format": "ogg"}],
        "ModelInput.piper-en-us-joe": [{"prompt": "Hello.", "speed": 1.5}],
        "ModelInput.whisper-tiny-en": [{"audio_url": "https://example.com/a.wav", "language": "en"}],
        "ModelInput.dcgan-faces-64": [{"num_images": 2, "seed": 7, "output_format": "jpeg"}],
        "ModelInput.eyes-128": [{"prompt": "green eyes"}],
        "ModelInput.terrain-128": [{"difficulty": 3}],
        "ModelInput.interpolate-video": [{"images": ["https://example.com/a.png", "https://example.com/b.png"], "fps": 24}],
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schemas.json");
    let input = serde_json::json!({"schemas": schemas, "accepted": accepted});
    std::fs::write(&path, input.to_string()).unwrap();
    let script = r#"
import json, sys
from jsonschema import Draft202012Validator
data = json.load(open(sys.argv[1]))
for name, schema in data["schemas"].items():
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    for sample in data["accepted"].get(name, []):
        errors = [e.message for e in validator.iter_errors(sample)]
        assert not errors, (name, sample, errors)
    unknown = {"no_such_member_anywhere": 1}
    if name != "ModelInput.gantry-echo":
        assert not validator.is_valid(unknown), (name, "takes an unknown member")
    assert not validator.is_valid("not an object"), name
print("checked", len(data["schemas"]))
"#;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "needs `pip install jsonschema`:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("checked"), "{stdout}");
}
