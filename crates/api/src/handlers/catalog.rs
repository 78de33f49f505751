use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::{
    Compliance, CpuType, DataCenterFilter, DataCenterInclude, DataCenterRegion, DataCenterView, GpuType, VolumeType,
    availability_of,
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::body::query_list;
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListDataCentersResponse {
    pub data_centers: Vec<DataCenterView>,
}

/// Splits a query string into known parameters; unknown ones are an error, not a silent no-op.
pub(crate) fn query_pairs(req: &HttpRequest, known: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(req.query_string())
        .map_err(|e| ApiError::bad_request(format!("query string could not be parsed: {e}")))?;
    let unknown: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, _)| format!("{k}: unknown query parameter (supported: {})", known.join(", ")))
        .collect();
    if unknown.is_empty() {
        Ok(pairs)
    } else {
        Err(ApiError::BadRequest {
            detail: "invalid query parameters".into(),
            errors: unknown,
        })
    }
}

fn finish_query(errors: Vec<String>) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::BadRequest {
            detail: "invalid query parameters".into(),
            errors,
        })
    }
}

#[utoipa::path(get, path = "/v2/catalog/datacenters", operation_id = "listDataCenters", tag = "Catalog",
    description = "Lists data centers. `regions` (any of), `networkVolumeTypes` (all of), `compliance` (all of) and `globalNetwork` filter the list; `include=GPU_AVAILABILITY,CPU_AVAILABILITY` adds availability arrays. Requires `catalog:read`.",
    params(
        ("include" = Option<String>, Query, description = "Comma-separated: GPU_AVAILABILITY, CPU_AVAILABILITY"),
        ("regions" = Option<String>, Query, description = "Comma-separated DataCenterRegion values (OR)"),
        ("networkVolumeTypes" = Option<String>, Query, description = "Comma-separated volume types (AND)"),
        ("compliance" = Option<String>, Query, description = "Comma-separated Compliance values (AND)"),
        ("globalNetwork" = Option<bool>, Query, description = "Only data centers with (true) or without (false) global networking"),
    ),
    responses((status = 200, description = "OK", body = ListDataCentersResponse)))]
pub async fn list_data_centers(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let pairs = query_pairs(
        &req,
        &[
            "include",
            "regions",
            "networkVolumeTypes",
            "compliance",
            "globalNetwork",
        ],
    )?;
    let mut errors = Vec::new();
    let mut include = Vec::new();
    let mut filter = DataCenterFilter::default();
    for (key, value) in &pairs {
        match key.as_str() {
            "include" => include.extend(query_list::<DataCenterInclude>(key, value, &mut errors)),
            "regions" => filter
                .regions
                .extend(query_list::<DataCenterRegion>(key, value, &mut errors)),
            "networkVolumeTypes" => {
                filter
                    .network_volume_types
                    .extend(query_list::<VolumeType>(key, value, &mut errors))
            }
            "compliance" => filter
                .compliance
                .extend(query_list::<Compliance>(key, value, &mut errors)),
            _ => match value.as_str() {
                "true" => filter.global_network = Some(true),
                "false" => filter.global_network = Some(false),
                other => errors.push(format!("{key}: must be true or false (got '{other}')")),
            },
        }
    }
    finish_query(errors)?;
    let data_centers = state.catalog.list(&filter).map(|dc| dc.view(&include)).collect();
    Ok(HttpResponse::Ok().json(ListDataCentersResponse { data_centers }))
}

#[utoipa::path(get, path = "/v2/catalog/datacenters/{id}", operation_id = "getDataCenter", tag = "Catalog",
    description = "Returns one data center. Requires `catalog:read`.",
    params(
        ("id" = String, Path, description = "Data center identifier", example = "US-CA-2"),
        ("include" = Option<String>, Query, description = "Comma-separated: GPU_AVAILABILITY, CPU_AVAILABILITY"),
    ),
    responses((status = 200, description = "OK", body = DataCenterView)))]
pub async fn get_data_center(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let pairs = query_pairs(&req, &["include"])?;
    let mut errors = Vec::new();
    let include: Vec<DataCenterInclude> = pairs.iter().flat_map(|(k, v)| query_list(k, v, &mut errors)).collect();
    finish_query(errors)?;
    let dc = state
        .catalog
        .data_center(&id)
        .ok_or_else(|| ApiError::NotFound("data center not found".into()))?;
    Ok(HttpResponse::Ok().json(dc.view(&include)))
}

/// `include=AVAILABILITY` and what it is asked for.
struct AvailabilityQuery {
    /// Whether the serverless product (Gantry's workers) is asked for.
    serverless: bool,
    /// GPUs per unit (`count`).
    count: u64,
    cloud: Option<String>,
    /// A filter Gantry's workers say nothing about (location, CUDA version):
    /// nothing can be shown available under it.
    unknowable: bool,
}

/// Parses the catalog's hardware query; `gpu` selects the GPU parameters.
fn hardware_query(req: &HttpRequest, gpu: bool) -> Result<Option<AvailabilityQuery>, ApiError> {
    let known: &[&str] = if gpu {
        &[
            "include",
            "product",
            "count",
            "cloud",
            "countryCodes",
            "cudaVersions",
            "minCudaVersion",
        ]
    } else {
        &["include", "product", "vcpuCount"]
    };
    let pairs = query_pairs(req, known)?;
    let mut errors = Vec::new();
    let list = |value: &str| -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
            .collect()
    };
    let (mut include, mut products, mut count, mut cloud, mut unknowable) = (false, Vec::new(), None, None, false);
    let mut with_availability_only = Vec::new();
    for (key, value) in &pairs {
        match key.as_str() {
            "include" => {
                let values = list(value);
                if values.len() != 1 || values[0] != "AVAILABILITY" {
                    errors.push(format!("include: {value:?} is not AVAILABILITY (the one expansion)"));
                }
                include = true;
            }
            "product" => {
                let allowed: &[&str] = if gpu {
                    &["POD", "CLUSTER", "SERVERLESS"]
                } else {
                    &["POD", "SERVERLESS"]
                };
                for product in list(value) {
                    if allowed.contains(&product.as_str()) {
                        products.push(product);
                    } else {
                        errors.push(format!("product: {product:?} is not one of {}", allowed.join(", ")));
                    }
                }
                with_availability_only.push("product");
            }
            "count" => {
                match value.parse::<u64>() {
                    Ok(n) if n >= 1 => count = Some(n),
                    _ => errors.push(format!("count: {value:?} is not an integer of at least 1")),
                }
                with_availability_only.push("count");
            }
            "vcpuCount" => {
                match value.parse::<u64>() {
                    Ok(n) if n >= 2 && n.is_power_of_two() => {}
                    _ => errors.push(format!("vcpuCount: {value:?} is not a power of two of at least 2")),
                }
                with_availability_only.push("vcpuCount");
            }
            "cloud" => {
                if value == "SECURE" || value == "COMMUNITY" {
                    cloud = Some(value.clone());
                } else {
                    errors.push(format!("cloud: {value:?} is not SECURE or COMMUNITY"));
                }
                with_availability_only.push("cloud");
            }
            "countryCodes" | "cudaVersions" if list(value).is_empty() => {
                errors.push(format!("{key}: must name at least one value"));
            }
            "countryCodes" => {
                for code in list(value) {
                    if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
                        errors.push(format!(
                            "countryCodes: {code:?} is not an uppercase ISO 3166-1 alpha-2 code"
                        ));
                    }
                }
                unknowable = true;
            }
            "cudaVersions" => {
                for version in list(value) {
                    let ok = version.split_once('.').is_some_and(|(a, b)| {
                        !a.is_empty() && !b.is_empty() && (a.to_owned() + b).bytes().all(|c| c.is_ascii_digit())
                    });
                    if !ok {
                        errors.push(format!("cudaVersions: {version:?} is not major.minor, e.g. 12.8"));
                    }
                }
                unknowable = true;
            }
            "minCudaVersion" => {
                let (major, minor) = value.split_once('.').unwrap_or((value.as_str(), "0"));
                if major.is_empty()
                    || minor.is_empty()
                    || !(major.to_owned() + minor).bytes().all(|c| c.is_ascii_digit())
                {
                    errors.push(format!(
                        "minCudaVersion: {value:?} is not a major or major.minor version"
                    ));
                }
                unknowable = true;
            }
            _ => {}
        }
    }
    if include && products.is_empty() && !errors.iter().any(|e| e.starts_with("product:")) {
        errors.push("product: required with include=AVAILABILITY (POD, CLUSTER or SERVERLESS)".into());
    }
    if !include {
        for key in with_availability_only {
            errors.push(format!("{key}: valid only with include=AVAILABILITY"));
        }
    }
    finish_query(errors)?;
    Ok(include.then(|| AvailabilityQuery {
        serverless: products.iter().any(|p| p == "SERVERLESS"),
        count: count.unwrap_or(1),
        cloud,
        unknowable,
    }))
}

/// A GPU type as the catalog shows it: availability from the workers that
/// report it (Gantry runs serverless workers only: pods and clusters are
/// never available; each worker reports one GPU).
fn gpu_view(gpu: &GpuType, query: Option<&AvailabilityQuery>, workers: &[(String, u64, u64)]) -> serde_json::Value {
    let mut view = serde_json::to_value(gpu).unwrap_or_default();
    if let Some(query) = query {
        let cloud_ok = match query.cloud.as_deref() {
            Some("SECURE") => gpu.secure,
            Some("COMMUNITY") => gpu.community,
            _ => true,
        };
        let count = if query.serverless && cloud_ok && !query.unknowable && query.count == 1 {
            workers
                .iter()
                .filter(|(name, ..)| name.eq_ignore_ascii_case(&gpu.id))
                .map(|(_, n, _)| *n)
                .sum()
        } else {
            0
        };
        view["availability"] = serde_json::to_value(availability_of(count)).unwrap_or_default();
    }
    view
}

/// A CPU flavor: available while workers without a GPU are connected.
fn cpu_view(cpu: &CpuType, query: Option<&AvailabilityQuery>, workers: &[(String, u64, u64)]) -> serde_json::Value {
    let mut view = serde_json::to_value(cpu).unwrap_or_default();
    if let Some(query) = query {
        let count = if query.serverless {
            workers
                .iter()
                .filter(|(name, ..)| name.is_empty())
                .map(|(_, n, _)| *n)
                .sum()
        } else {
            0
        };
        view["availability"] = serde_json::to_value(availability_of(count)).unwrap_or_default();
    }
    view
}

#[utoipa::path(get, path = "/v2/catalog/gpus", operation_id = "listGpuTypes", tag = "Catalog",
    description = "GPU types with list prices (USD per GPU-hour). `include=AVAILABILITY` (with `product`) adds \
`availability`: for `SERVERLESS`, from the workers connected now that report the GPU in their hello (1 worker LOW, \
2–3 MEDIUM, 4 or more HIGH); `POD` and `CLUSTER` are never available (Gantry runs neither), nor is a `count` above \
1 (a worker reports one GPU) or a `countryCodes`/`cudaVersions`/`minCudaVersion` filter (workers report neither). \
Requires `catalog:read`.",
    params(
        ("include" = Option<String>, Query, description = "AVAILABILITY"),
        ("product" = Option<String>, Query, description = "Comma-separated: POD, CLUSTER, SERVERLESS (required with include)"),
        ("count" = Option<u64>, Query, description = "GPUs per unit (with include); default 1"),
        ("cloud" = Option<String>, Query, description = "SECURE or COMMUNITY (with include)"),
        ("countryCodes" = Option<String>, Query, description = "Comma-separated ISO 3166-1 alpha-2 codes"),
        ("cudaVersions" = Option<String>, Query, description = "Comma-separated major.minor versions"),
        ("minCudaVersion" = Option<String>, Query, description = "Lowest CUDA version"),
    ),
    responses((status = 200, description = "OK")))]
pub async fn list_gpus(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = hardware_query(&req, true)?;
    let workers = match &query {
        Some(_) => state.census.worker_gpus().await?,
        None => Vec::new(),
    };
    let gpus: Vec<serde_json::Value> = state
        .gpus
        .iter()
        .map(|g| gpu_view(g, query.as_ref(), &workers))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "gpus": gpus })))
}

#[utoipa::path(get, path = "/v2/catalog/gpus/{id}", operation_id = "getGpuType", tag = "Catalog",
    description = "One GPU type by id (the driver's device name, URL-encoded); parameters as for the list. \
Requires `catalog:read`.",
    params(
        ("id" = String, Path, description = "GPU type id, e.g. NVIDIA H100 80GB HBM3"),
        ("include" = Option<String>, Query, description = "AVAILABILITY"),
        ("product" = Option<String>, Query, description = "Comma-separated: POD, CLUSTER, SERVERLESS (required with include)"),
        ("count" = Option<u64>, Query, description = "GPUs per unit (with include); default 1"),
        ("cloud" = Option<String>, Query, description = "SECURE or COMMUNITY (with include)"),
        ("countryCodes" = Option<String>, Query, description = "Comma-separated ISO 3166-1 alpha-2 codes"),
        ("cudaVersions" = Option<String>, Query, description = "Comma-separated major.minor versions"),
        ("minCudaVersion" = Option<String>, Query, description = "Lowest CUDA version"),
    ),
    responses((status = 200, description = "OK")))]
pub async fn get_gpu(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = hardware_query(&req, true)?;
    let gpu = state
        .gpus
        .iter()
        .find(|g| g.id == *id)
        .ok_or_else(|| ApiError::NotFound(format!("no GPU type {:?}", id.as_str())))?;
    let workers = match &query {
        Some(_) => state.census.worker_gpus().await?,
        None => Vec::new(),
    };
    Ok(HttpResponse::Ok().json(gpu_view(gpu, query.as_ref(), &workers)))
}

#[utoipa::path(get, path = "/v2/catalog/cpus", operation_id = "listCpuTypes", tag = "Catalog",
    description = "CPU flavors with list prices (USD per vCPU-hour). `include=AVAILABILITY` (with `product`) adds \
`availability`: for `SERVERLESS`, from the connected workers without a GPU; `POD` is never available. Requires \
`catalog:read`.",
    params(
        ("include" = Option<String>, Query, description = "AVAILABILITY"),
        ("product" = Option<String>, Query, description = "Comma-separated: POD, SERVERLESS (required with include)"),
        ("vcpuCount" = Option<u64>, Query, description = "A power of two, at least 2 (with include)"),
    ),
    responses((status = 200, description = "OK")))]
pub async fn list_cpus(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = hardware_query(&req, false)?;
    let workers = match &query {
        Some(_) => state.census.worker_gpus().await?,
        None => Vec::new(),
    };
    let cpus: Vec<serde_json::Value> = state
        .cpus
        .iter()
        .map(|c| cpu_view(c, query.as_ref(), &workers))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "cpus": cpus })))
}

#[utoipa::path(get, path = "/v2/catalog/cpus/{id}", operation_id = "getCpuType", tag = "Catalog",
    description = "One CPU flavor by id; parameters as for the list. Requires `catalog:read`.",
    params(
        ("id" = String, Path, description = "CPU flavor id, e.g. cpu5c"),
        ("include" = Option<String>, Query, description = "AVAILABILITY"),
        ("product" = Option<String>, Query, description = "Comma-separated: POD, SERVERLESS (required with include)"),
        ("vcpuCount" = Option<u64>, Query, description = "A power of two, at least 2 (with include)"),
    ),
    responses((status = 200, description = "OK")))]
pub async fn get_cpu(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = hardware_query(&req, false)?;
    let cpu = state
        .cpus
        .iter()
        .find(|c| c.id == *id)
        .ok_or_else(|| ApiError::NotFound(format!("no CPU flavor {:?}", id.as_str())))?;
    let workers = match &query {
        Some(_) => state.census.worker_gpus().await?,
        None => Vec::new(),
    };
    Ok(HttpResponse::Ok().json(cpu_view(cpu, query.as_ref(), &workers)))
}
