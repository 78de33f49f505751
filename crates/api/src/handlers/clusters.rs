//! `/v2/clusters`: pods of one GPU shape started together on a private network of their own,
//! where each member reaches the others as `node-<rank>` (docs/pods.md, "Clusters").
//!
//! A member is a pod like any other (`/v2/pods` lists it, its log and billing are a pod's), except
//! that it is changed, stopped and deleted with its cluster only.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_containers::PodStatus;
use gantry_containers::check_name;
use gantry_containers::clusters::{ClusterCompute, ClusterKind, ClusterRecord};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::body::{Failures, RequestBody, present, present_object, read_body};
use crate::handlers::pods::{Pod, member_spec, pod_view, prices_of, require_credit};
use crate::handlers::serverless::{poke, require_runtime};
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

/// A cluster to create: its shape, and the container every member runs.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateClusterRequest {
    #[schema(min_length = 1, max_length = 191, example = "my-training-cluster")]
    name: String,
    #[serde(rename = "type")]
    kind: ClusterKind,
    compute: ClusterCompute,
    /// Image reference: `[registry/]name[:tag][@digest]`.
    #[schema(min_length = 1, max_length = 512)]
    image: String,
    /// Arguments of the entrypoint, split like a shell (quotes group; no expansion).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, max_length = 8192)]
    args: Option<String>,
    /// Environment variables of every member (besides the cluster's own: `NODE_RANK`, ...).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    env: Option<BTreeMap<String, String>>,
    /// Exposed ports as `port/protocol` (http, tcp, udp).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, max_items = 32)]
    ports: Option<Vec<String>>,
    /// Container disk of each member, GB (1 to 2048; default 20).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 2048)]
    disk: Option<u32>,
    /// Mounts of every member: a persistent disk each, and a network volume they share.
    #[serde(default, deserialize_with = "present_object")]
    #[schema(nullable = false, value_type = Object)]
    mounts: Option<Value>,
    /// Accepted for compatibility: the cluster runs on this platform's runtime.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    data_center_ids: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    start_ssh: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, default = false)]
    start_jupyter: Option<bool>,
}

impl RequestBody for CreateClusterRequest {
    type Context = ();
    type Valid = CreateClusterRequest;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<CreateClusterRequest> {
        if let Err(problem) = check_name(&self.name) {
            failures.fail("name", problem);
        }
        let compute = &self.compute;
        if !(2..=250).contains(&compute.pod_count) {
            failures.fail(
                "compute.podCount",
                format!("must be from 2 to 250 (got {})", compute.pod_count),
            );
        }
        if !(1..=8).contains(&compute.gpu_count_per_pod) {
            failures.fail(
                "compute.gpuCountPerPod",
                format!("must be from 1 to 8 (got {})", compute.gpu_count_per_pod),
            );
        }
        Some(self)
    }
}

/// A rename: the only change a cluster takes.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateClusterRequest {
    #[schema(min_length = 1, max_length = 191)]
    name: String,
}

impl RequestBody for UpdateClusterRequest {
    type Context = ();
    type Valid = String;

    fn validate(self, _: &(), failures: &mut Failures) -> Option<String> {
        if let Err(problem) = check_name(&self.name) {
            failures.fail("name", problem);
        }
        Some(self.name)
    }
}

/// How many members there are, by status.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPods {
    total: usize,
    by_status: BTreeMap<String, usize>,
}

/// The member of rank 0.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPrimary {
    pod_id: String,
    status: PodStatus,
}

/// A cluster.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    id: String,
    name: String,
    #[serde(rename = "type")]
    kind: ClusterKind,
    compute: ClusterCompute,
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_center_id: Option<String>,
    pods: ClusterPods,
    #[serde(skip_serializing_if = "Option::is_none")]
    primary: Option<ClusterPrimary>,
    #[schema(format = DateTime)]
    created_at: String,
}

#[derive(Serialize, ToSchema)]
pub struct ListClustersResponse {
    clusters: Vec<Cluster>,
}

#[derive(Serialize, ToSchema)]
pub struct ListClusterPodsResponse {
    pods: Vec<Pod>,
}

async fn cluster_view(state: &AppState, record: ClusterRecord) -> Result<Cluster, ApiError> {
    let members = state.containers.cluster_members(&record.user_id, &record.id).await?;
    let mut by_status = BTreeMap::new();
    for member in &members {
        *by_status.entry(member.status.as_str().to_owned()).or_insert(0) += 1;
    }
    let primary = members
        .iter()
        .find(|m| m.spec.cluster.as_ref().is_some_and(|c| c.rank == 0))
        .map(|m| ClusterPrimary {
            pod_id: m.id.clone(),
            status: m.status,
        });
    Ok(Cluster {
        id: record.id,
        name: record.name,
        kind: record.kind,
        compute: record.compute,
        template: record.template,
        data_center_id: state.catalog.home().map(|dc| dc.id.clone()),
        pods: ClusterPods {
            total: members.len(),
            by_status,
        },
        primary,
        created_at: gantry_billing::history::format_rfc3339(record.created_at_ms),
    })
}

#[utoipa::path(get, path = "/v2/clusters", operation_id = "listClusters", tag = "Clusters",
    description = "The caller's clusters. Requires `pods:read`.",
    responses((status = 200, description = "OK", body = ListClustersResponse)))]
pub async fn list_clusters(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let mut clusters = Vec::new();
    for record in state.containers.list_clusters(caller.user_id()).await? {
        clusters.push(cluster_view(&state, record).await?);
    }
    Ok(HttpResponse::Ok().json(ListClustersResponse { clusters }))
}

#[utoipa::path(post, path = "/v2/clusters", operation_id = "createCluster", tag = "Clusters",
    description = "Creates `compute.podCount` pods of `compute.gpuCountPerPod` GPUs of `compute.gpuTypeId` each, running `image`, on a private network of their own where member `r` is `node-r`; each gets `NODE_RANK`, `NUM_NODES`, `NODE_ADDR`, `PRIMARY_ADDR`/`MASTER_ADDR` (`node-0`), `PRIMARY_PORT`/`MASTER_PORT` (29500), `NUM_TRAINERS` and `WORLD_SIZE`. Each member is billed as a pod. Requires `pods:write`.",
    request_body = CreateClusterRequest,
    responses((status = 201, description = "Created; the members start", body = Cluster),
        (status = 422, description = "Invalid body, every failure listed", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 402, description = "No credit, when credit is required", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No container runtime", body = crate::problem::Problem, content_type = "application/problem+json")))]
pub async fn create_cluster(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let body = read_body::<CreateClusterRequest>(&req, payload, state.body_limit, &()).await?;
    require_runtime(&state)?;
    require_credit(&state, caller.user_id()).await?;
    let owner = caller.user_id();
    if !state.gpus.iter().any(|g| g.id == body.compute.gpu_type_id) {
        let mut failures = Failures::default();
        failures.fail(
            "compute.gpuTypeId",
            format!("unknown GPU type '{}'", body.compute.gpu_type_id),
        );
        return Err(failures.into_api_error());
    }
    // Each member is checked as the pod it is.
    let mut pod = json!({
        "name": format!("{}-0", body.name),
        "image": body.image,
        "gpu": {"id": body.compute.gpu_type_id, "count": body.compute.gpu_count_per_pod},
    });
    for (field, value) in [
        ("args", body.args.map(Value::from)),
        ("env", body.env.map(|e| json!(e))),
        ("ports", body.ports.map(|p| json!(p))),
        ("disk", body.disk.map(Value::from)),
        ("mounts", body.mounts),
        ("dataCenterIds", body.data_center_ids.map(|d| json!(d))),
        ("startSsh", body.start_ssh.map(Value::from)),
        ("startJupyter", body.start_jupyter.map(Value::from)),
    ] {
        if let Some(value) = value {
            pod[field] = value;
        }
    }
    let spec = member_spec(&state, owner, pod).await?;
    let prices = prices_of(&state, &spec);
    let record = state
        .containers
        .create_cluster(owner, &body.name, body.kind, body.compute, spec, prices)
        .await?;
    poke(&state);
    Ok(HttpResponse::Created().json(cluster_view(&state, record).await?))
}

#[utoipa::path(get, path = "/v2/clusters/{id}", operation_id = "getCluster", tag = "Clusters",
    description = "One of the caller's clusters. Requires `pods:read`.",
    params(("id" = String, Path, description = "Cluster id")),
    responses((status = 200, description = "OK", body = Cluster)))]
pub async fn get_cluster(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let record = state.containers.get_cluster(caller.user_id(), &id).await?;
    Ok(HttpResponse::Ok().json(cluster_view(&state, record).await?))
}

#[utoipa::path(patch, path = "/v2/clusters/{id}", operation_id = "updateCluster", tag = "Clusters",
    description = "Renames a cluster (its shape and container are fixed at creation). Requires `pods:write`.",
    params(("id" = String, Path, description = "Cluster id")),
    request_body = UpdateClusterRequest,
    responses((status = 200, description = "OK", body = Cluster)))]
pub async fn update_cluster(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    let name = read_body::<UpdateClusterRequest>(&req, payload, state.body_limit, &()).await?;
    let record = state.containers.rename_cluster(caller.user_id(), &id, &name).await?;
    Ok(HttpResponse::Ok().json(cluster_view(&state, record).await?))
}

#[utoipa::path(delete, path = "/v2/clusters/{id}", operation_id = "deleteCluster", tag = "Clusters",
    description = "Deletes a cluster: every member is terminated (billed up to then), then its network is removed. Requires `pods:write`.",
    params(("id" = String, Path, description = "Cluster id")),
    responses((status = 204, description = "Deleted. Response has no body.")))]
pub async fn delete_cluster(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsWrite)?;
    state.containers.delete_cluster(caller.user_id(), &id).await?;
    poke(&state);
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(get, path = "/v2/clusters/{id}/pods", operation_id = "listClusterPods", tag = "Clusters",
    description = "A cluster's members, by rank, as pods. Requires `pods:read`.",
    params(("id" = String, Path, description = "Cluster id")),
    responses((status = 200, description = "OK", body = ListClusterPodsResponse)))]
pub async fn cluster_pods(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::PodsRead)?;
    let owner = caller.user_id();
    state.containers.get_cluster(owner, &id).await?;
    let mut pods = Vec::new();
    for member in state.containers.cluster_members(owner, &id).await? {
        pods.push(pod_view(&state, member, false).await);
    }
    Ok(HttpResponse::Ok().json(ListClusterPodsResponse { pods }))
}
