use serde_json::Value;

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(data_centers_list_filter_and_get);

async fn ids(app: &TestApp, key: &str, query: &str) -> Vec<String> {
    let res = app.get(&format!("/v2/catalog/datacenters{query}"), key).await;
    assert_eq!(res.status(), 200, "{query}");
    let body: Value = res.json().await.unwrap();
    body["dataCenters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect()
}

async fn data_centers_list_filter_and_get(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("catalog:read").await;

    let all: Value = app.get("/v2/catalog/datacenters", &key).await.json().await.unwrap();
    let list = all["dataCenters"].as_array().unwrap();
    assert!(list.len() >= 5);
    for dc in list {
        for field in [
            "id",
            "name",
            "region",
            "networkVolumeTypes",
            "compliance",
            "globalNetwork",
        ] {
            assert!(dc.get(field).is_some(), "{field} missing in {dc}");
        }
        assert!(
            dc.get("gpuAvailability").is_none() && dc.get("cpuAvailability").is_none(),
            "no availability unless asked"
        );
    }

    assert_eq!(
        ids(&app, &key, "?regions=EUROPE").await,
        ["EU-RO-1", "EU-SE-1", "EU-CZ-1"]
    );
    assert_eq!(ids(&app, &key, "?regions=ASIA,OCEANIA").await, ["AP-JP-1", "OC-AU-1"]);
    assert_eq!(
        ids(&app, &key, "?networkVolumeTypes=STANDARD,HIGH_PERFORMANCE").await,
        ["US-KS-2", "US-CA-2", "EU-RO-1"],
        "volume types combine with AND"
    );
    assert_eq!(
        ids(&app, &key, "?compliance=GDPR,SOC_2_TYPE_2").await,
        ["EU-RO-1"],
        "compliance combines with AND"
    );
    assert_eq!(
        ids(&app, &key, "?regions=EUROPE&globalNetwork=true").await,
        ["EU-RO-1"],
        "families combine with AND"
    );
    assert_eq!(
        ids(&app, &key, "?globalNetwork=false&regions=NORTH_AMERICA").await,
        ["US-CA-2"]
    );

    let with: Value = app
        .get("/v2/catalog/datacenters?include=GPU_AVAILABILITY", &key)
        .await
        .json()
        .await
        .unwrap();
    for dc in with["dataCenters"].as_array().unwrap() {
        let has_gpus = dc.get("gpuAvailability").is_some();
        assert_eq!(has_gpus, dc["id"] != "EU-CZ-1", "omitted where there are no GPUs: {dc}");
        assert!(dc.get("cpuAvailability").is_none());
    }

    let bad = app
        .get(
            "/v2/catalog/datacenters?regions=MARS,EUROPE&globalNetwork=maybe&include=ALL",
            &key,
        )
        .await;
    let body = problem(bad, 400).await;
    assert_eq!(
        errors_of(&body),
        [
            "regions: unknown value 'MARS'",
            "globalNetwork: must be true or false (got 'maybe')",
            "include: unknown value 'ALL'"
        ]
    );
    let body = problem(app.get("/v2/catalog/datacenters?region=EUROPE", &key).await, 400).await;
    assert!(errors_of(&body)[0].starts_with("region: unknown query parameter"));

    let one: Value = app
        .get("/v2/catalog/datacenters/EU-RO-1?include=CPU_AVAILABILITY", &key)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], "EU-RO-1");
    assert_eq!(one["region"], "EUROPE");
    assert!(one["cpuAvailability"].as_array().is_some_and(|a| !a.is_empty()));
    let missing = problem(app.get("/v2/catalog/datacenters/NOPE-9", &key).await, 404).await;
    assert_eq!(missing["detail"], "data center not found");
}
