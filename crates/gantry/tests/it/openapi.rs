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
    let doc: Value = app
        .client
        .get(format!("{}/v2/openapi.json", app.public_base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
