//! Clusters through the management API, on a real Docker engine: members that find each other by
//! name on their own network, the cluster's rules, its billing, and its deletion.
//!
//! Clusters are GPU-only (as in the reference), so the engine is one of this test's own with a
//! stand-in for the NVIDIA Container Toolkit's hook (`GANTRY_TEST_DOCKER_FAKE_GPUS`): its GPU
//! containers start, without GPUs, and everything Gantry asks of the engine is real.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, errors_of, problem};
use crate::pods::OwnEngine;

const BUSYBOX: &str = "gantry-test/busybox:1";
const H100: &str = "NVIDIA H100 80GB HBM3";

/// The engine's networks' names.
fn networks(host: &str) -> Vec<String> {
    crate::serverless::docker_cli(host, &["network", "ls", "--format", "{{.Name}}"])
        .expect("the docker command runs")
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn json_of(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// The lines of a pod's log (container and system).
async fn log_of(app: &TestApp, key: &str, pod: &str) -> Vec<String> {
    let body = app
        .get(&format!("/v2/pods/{pod}/logs?tail=1000"), key)
        .await
        .text()
        .await
        .unwrap();
    crate::harness::parse_sse(&body)
        .into_iter()
        .map(|(_, _, data)| data["line"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn a_cluster_of_three_finds_each_other_by_name_and_is_billed_and_deleted_as_one() {
    let engine = OwnEngine::start("clusters", true).await;
    let app = TestApp::spawn_with(Backend::Sqlite, {
        let host = engine.host.clone();
        move |settings| {
            settings.serverless.docker_host = Some(host);
            settings.serverless.tick_ms = 200;
            settings.serverless.stop_grace_ms = 1_000;
        }
    })
    .await;
    let (_, key) = app.user_with_key("all").await;

    // Bad shapes change nothing and say every problem.
    let bad = json!({"name": "x", "type": "TRAINING", "image": BUSYBOX,
                     "compute": {"gpuTypeId": H100, "gpuCountPerPod": 0, "podCount": 1}});
    let body = problem(app.send_json(Method::POST, "/v2/clusters", &key, &bad).await, 422).await;
    let errors = errors_of(&body);
    assert!(errors.iter().any(|e| e.contains("compute.podCount")), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("compute.gpuCountPerPod")),
        "{errors:?}"
    );
    let unknown = json!({"name": "x", "type": "TRAINING", "image": BUSYBOX,
                         "compute": {"gpuTypeId": "NO SUCH GPU", "gpuCountPerPod": 1, "podCount": 2}});
    let body = problem(app.send_json(Method::POST, "/v2/clusters", &key, &unknown).await, 422).await;
    assert!(
        errors_of(&body).iter().any(|e| e.contains("compute.gpuTypeId")),
        "{body}"
    );
    let (_, listed) = json_of(app.get("/v2/clusters", &key).await).await;
    assert_eq!(listed["clusters"], json!([]), "nothing was made");

    // Each member pings the others by name, then says what the cluster told it.
    let args = "sh -c 'sleep 1; for n in 0 1 2; do ping -c1 -W3 node-$n >/dev/null && echo reached node-$n; done; \
                echo rank=$NODE_RANK of $NUM_NODES world=$WORLD_SIZE primary=$PRIMARY_ADDR; exec sleep 3600'";
    let create = json!({"name": "trainers", "type": "TRAINING", "image": BUSYBOX, "args": args,
                        "compute": {"gpuTypeId": H100, "gpuCountPerPod": 2, "podCount": 3}});
    let (status, cluster) = json_of(app.send_json(Method::POST, "/v2/clusters", &key, &create).await).await;
    assert_eq!(status, 201, "{cluster}");
    let id = cluster["id"].as_str().unwrap().to_owned();
    assert_eq!(cluster["type"], "TRAINING");
    assert_eq!(
        cluster["compute"],
        json!({"gpuTypeId": H100, "gpuCountPerPod": 2, "podCount": 3})
    );
    assert_eq!(cluster["pods"]["total"], 3);

    let deadline = Instant::now() + Duration::from_secs(120);
    let members = loop {
        let (_, pods) = json_of(app.get(&format!("/v2/clusters/{id}/pods"), &key).await).await;
        let pods = pods["pods"].as_array().cloned().unwrap_or_default();
        if pods.len() == 3 && pods.iter().all(|p| p["status"] == "RUNNING") {
            break pods;
        }
        assert!(Instant::now() < deadline, "the members never all ran: {pods:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (rank, member) in members.iter().enumerate() {
        assert_eq!(member["cluster"], json!({"id": id, "rank": rank}));
        assert_eq!(member["gpu"], json!({"id": H100, "count": 2}));
        assert_eq!(member["name"], format!("trainers-{rank}"));
    }
    for (rank, member) in members.iter().enumerate() {
        let pod = member["id"].as_str().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = log_of(&app, &key, pod).await;
            let said = |line: &str| log.iter().any(|l| l == line);
            if said(&format!("rank={rank} of 3 world=6 primary=node-0")) {
                for other in 0..3 {
                    assert!(
                        said(&format!("reached node-{other}")),
                        "member {rank} did not reach node-{other}: {log:?}"
                    );
                }
                break;
            }
            assert!(Instant::now() < deadline, "member {rank} never said its rank: {log:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (_, cluster) = json_of(app.get(&format!("/v2/clusters/{id}"), &key).await).await;
    assert_eq!(cluster["pods"]["byStatus"], json!({"RUNNING": 3}));
    assert_eq!(cluster["primary"]["podId"], members[0]["id"]);
    assert!(networks(&engine.host).contains(&format!("gantry-{id}")));

    // A member is acted on with its cluster only.
    let member = members[1]["id"].as_str().unwrap();
    let refused = problem(
        app.send_json(
            Method::POST,
            &format!("/v2/pods/{member}/action"),
            &key,
            &json!({"action": "stop"}),
        )
        .await,
        409,
    )
    .await;
    assert!(refused["detail"].as_str().unwrap().contains(&id), "{refused}");
    problem(
        app.send_json(Method::DELETE, &format!("/v2/pods/{member}"), &key, &json!({}))
            .await,
        409,
    )
    .await;

    // Renamed; another user sees nothing of it.
    let (status, renamed) = json_of(
        app.send_json(
            Method::PATCH,
            &format!("/v2/clusters/{id}"),
            &key,
            &json!({"name": "renamed"}),
        )
        .await,
    )
    .await;
    assert_eq!((status, renamed["name"].as_str()), (200, Some("renamed")));
    let (_, other) = app.user_with_key("all").await;
    problem(app.get(&format!("/v2/clusters/{id}"), &other).await, 404).await;
    problem(app.get(&format!("/v2/clusters/{id}/pods"), &other).await, 404).await;

    // Billed as a cluster: the members' seconds at their GPUs' price, not as pods.
    app.fleet
        .service()
        .accrue_pods(gantry_containers::service::now_ms())
        .await
        .unwrap();
    let (_, billed) = json_of(app.get("/v2/billing/clusters?bucketSize=hour&lastN=2", &key).await).await;
    let records = billed["records"].as_array().unwrap();
    assert!(!records.is_empty(), "{billed}");
    assert!(records.iter().all(|r| r["clusterId"] == id.as_str()), "{billed}");
    let gpu = billed["metadata"]["totals"]["gpuAmount"].as_f64().unwrap();
    assert!(gpu > 0.0, "{billed}");
    assert_eq!(billed["metadata"]["uniqueClusterCount"], 1);
    let (_, pods_billed) = json_of(app.get("/v2/billing/pods?bucketSize=hour&lastN=2", &key).await).await;
    assert_eq!(pods_billed["records"], json!([]), "members are not billed as pods too");
    let (_, overview) = json_of(app.get("/v2/billing?bucketSize=hour&lastN=2", &key).await).await;
    let totals = &overview["metadata"]["totals"];
    assert_eq!(totals["clusterGpuAmount"].as_f64(), Some(gpu), "{overview}");
    assert_eq!(totals["podGpuAmount"].as_f64(), Some(0.0), "{overview}");

    // Deleted: every member terminated, then the network removed.
    let res = app
        .send_json(Method::DELETE, &format!("/v2/clusters/{id}"), &key, &json!({}))
        .await;
    assert_eq!(res.status().as_u16(), 204);
    problem(app.get(&format!("/v2/clusters/{id}"), &key).await, 404).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while networks(&engine.host).contains(&format!("gantry-{id}")) {
        assert!(Instant::now() < deadline, "the cluster's network was never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, pods) = json_of(app.get("/v2/pods", &key).await).await;
    assert_eq!(pods["pods"], json!([]), "{pods}");
}
