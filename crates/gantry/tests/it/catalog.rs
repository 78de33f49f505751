use serde_json::Value;

use crate::harness::{Backend, TestApp, errors_of, problem};

gantry_testkit::on_both_backends!(
    data_centers_list_filter_and_get,
    gpu_availability_follows_the_workers_hello,
);

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

/// The availability of a GPU type (SERVERLESS), polled until it is `want`.
async fn until_gpu_availability(app: &TestApp, key: &str, id: &str, want: &str) {
    let path = format!(
        "/v2/catalog/gpus/{}?include=AVAILABILITY&product=SERVERLESS",
        id.replace(' ', "%20")
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let res = app.get(&path, key).await;
        assert_eq!(res.status(), 200);
        let body: Value = res.json().await.unwrap();
        if body["availability"] == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{id}: still {body}, want {want}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn gpu_availability_follows_the_workers_hello(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (_, key) = app.user_with_key("catalog:read").await;
    let h100 = "NVIDIA H100 80GB HBM3";

    // The list in the reference shape, without availability unless asked.
    let res = app.get("/v2/catalog/gpus", &key).await;
    let body: Value = res.json().await.unwrap();
    let gpu = body["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["id"] == h100)
        .unwrap()
        .clone();
    for field in [
        "name",
        "pool",
        "manufacturer",
        "memory",
        "secure",
        "community",
        "price",
        "maxCount",
    ] {
        assert!(gpu.get(field).is_some(), "{field}: {gpu}");
    }
    assert_eq!(gpu["manufacturer"], "NVIDIA");
    assert!(gpu.get("availability").is_none());
    until_gpu_availability(&app, &key, h100, "NONE").await;

    // A worker whose hello reports an H100 makes it available; gone, it is not.
    let url = format!("http://{}", app.scheduler.addr);
    let mut config = gantry_worker_sdk::WorkerConfig::new(
        url,
        "gpu-worker-1",
        gantry_worker_sdk::Credentials::Secret(app.scheduler.worker_secret().to_vec()),
    );
    config.gpu_name = h100.into();
    config.gpu_memory_bytes = 80 << 30;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(gantry_model_echo::runtime(config).run_until(async move {
        let _ = stopped.await;
    }));
    until_gpu_availability(&app, &key, h100, "LOW").await;
    // Not for pods, nor for two GPUs per unit, nor under a location filter.
    for query in [
        "product=POD",
        "product=SERVERLESS&count=2",
        "product=SERVERLESS&countryCodes=FR",
    ] {
        let res = app
            .get(
                &format!("/v2/catalog/gpus/NVIDIA%20H100%2080GB%20HBM3?include=AVAILABILITY&{query}"),
                &key,
            )
            .await;
        assert_eq!(res.json::<Value>().await.unwrap()["availability"], "NONE", "{query}");
    }
    // Other GPU types stay unavailable.
    until_gpu_availability(&app, &key, "NVIDIA L4", "NONE").await;
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    until_gpu_availability(&app, &key, h100, "NONE").await;

    // The bundled echo worker has no GPU: CPU capacity.
    let res = app
        .get("/v2/catalog/cpus/cpu5c?include=AVAILABILITY&product=SERVERLESS", &key)
        .await;
    let cpu: Value = res.json().await.unwrap();
    assert_eq!(cpu["availability"], "LOW", "{cpu}");
    assert_eq!(cpu["vcpu"]["min"], 2);

    // Unknown ids are 404; bad parameters are 400 with every failure listed.
    problem(app.get("/v2/catalog/gpus/NVIDIA%20Voodoo", &key).await, 404).await;
    problem(app.get("/v2/catalog/cpus/cpu9z", &key).await, 404).await;
    let res = app
        .get("/v2/catalog/gpus?product=SERVERLESS&count=0&cloud=MOON", &key)
        .await;
    let errors = errors_of(&problem(res, 400).await);
    assert_eq!(errors.len(), 5, "{errors:?}");
    let res = app
        .get(
            "/v2/catalog/gpus?include=AVAILABILITY&countryCodes=fr&cudaVersions=12",
            &key,
        )
        .await;
    let errors = errors_of(&problem(res, 400).await);
    assert_eq!(errors.len(), 3, "{errors:?}");
    let res = app
        .get(
            "/v2/catalog/cpus?include=AVAILABILITY&product=CLUSTER&vcpuCount=3",
            &key,
        )
        .await;
    let errors = errors_of(&problem(res, 400).await);
    assert_eq!(errors.len(), 2, "{errors:?}");
}
