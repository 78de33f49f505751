use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::{
    Compliance, CpuType, DataCenterFilter, DataCenterInclude, DataCenterRegion, DataCenterView, GpuType, VolumeType,
    availability_of,
};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::query::{self, Between, List, One, QueryValue, RequestQuery, parse_query};
use crate::state::AppState;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListDataCentersResponse {
    pub data_centers: Vec<DataCenterView>,
}

/// The data centers' filters and expansions.
#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct DataCentersQuery {
    /// Comma-separated: GPU_AVAILABILITY, CPU_AVAILABILITY
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    include: Option<List<DataCenterInclude>>,
    /// Comma-separated DataCenterRegion values (OR)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    regions: Option<List<DataCenterRegion>>,
    /// Comma-separated volume types (AND)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    network_volume_types: Option<List<VolumeType>>,
    /// Comma-separated Compliance values (AND)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    compliance: Option<List<Compliance>>,
    /// Only data centers with (true) or without (false) global networking
    #[serde(default, deserialize_with = "query::value")]
    global_network: Option<bool>,
}

impl RequestQuery for DataCentersQuery {
    type Valid = (DataCenterFilter, Vec<DataCenterInclude>);

    fn validate(self, _: &mut Vec<String>) -> Option<Self::Valid> {
        let filter = DataCenterFilter {
            regions: self.regions.unwrap_or_default().0,
            network_volume_types: self.network_volume_types.unwrap_or_default().0,
            compliance: self.compliance.unwrap_or_default().0,
            global_network: self.global_network,
        };
        Some((filter, self.include.unwrap_or_default().0))
    }
}

/// One data center's expansions.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DataCenterQuery {
    /// Comma-separated: GPU_AVAILABILITY, CPU_AVAILABILITY
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    include: Option<List<DataCenterInclude>>,
}

impl RequestQuery for DataCenterQuery {
    type Valid = Vec<DataCenterInclude>;

    fn validate(self, _: &mut Vec<String>) -> Option<Self::Valid> {
        Some(self.include.unwrap_or_default().0)
    }
}

#[utoipa::path(get, path = "/v2/catalog/datacenters", operation_id = "listDataCenters", tag = "Catalog",
    description = "Lists data centers. `regions` (any of), `networkVolumeTypes` (all of), `compliance` (all of) and `globalNetwork` filter the list; `include=GPU_AVAILABILITY,CPU_AVAILABILITY` adds availability arrays. Requires `catalog:read`.",
    params(DataCentersQuery),
    responses((status = 200, description = "OK", body = ListDataCentersResponse)))]
pub async fn list_data_centers(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let (filter, include) = parse_query::<DataCentersQuery>(&req)?;
    let data_centers = state.catalog.list(&filter).map(|dc| dc.view(&include)).collect();
    Ok(HttpResponse::Ok().json(ListDataCentersResponse { data_centers }))
}

#[utoipa::path(get, path = "/v2/catalog/datacenters/{id}", operation_id = "getDataCenter", tag = "Catalog",
    description = "Returns one data center. Requires `catalog:read`.",
    params(
        ("id" = String, Path, description = "Data center identifier", example = "US-CA-2"),
        DataCenterQuery,
    ),
    responses((status = 200, description = "OK", body = DataCenterView)))]
pub async fn get_data_center(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let include = parse_query::<DataCenterQuery>(&req)?;
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
    cloud: Option<Cloud>,
    /// A filter Gantry's workers say nothing about (location, CUDA version):
    /// nothing can be shown available under it.
    unknowable: bool,
}

/// The one expansion of the hardware lists.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Expansion {
    Availability,
}

/// What availability is asked for.
#[derive(Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Product {
    Pod,
    Cluster,
    Serverless,
}

/// A CPU flavor's products: no clusters of CPU pods.
#[derive(Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum CpuProduct {
    Pod,
    Serverless,
}

#[derive(Deserialize, ToSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Cloud {
    Secure,
    Community,
}

/// Comma-separated uppercase ISO 3166-1 alpha-2 codes.
struct CountryCodes;

impl QueryValue for CountryCodes {
    fn from_query(text: &str) -> Result<Self, String> {
        each_of(text, |code| {
            (code.len() == 2 && code.bytes().all(|b| b.is_ascii_uppercase()))
                .then_some(())
                .ok_or_else(|| format!("{code:?} is not an uppercase ISO 3166-1 alpha-2 code"))
        })
        .map(|()| Self)
    }
}

/// Comma-separated `major.minor` CUDA versions.
struct CudaVersions;

impl QueryValue for CudaVersions {
    fn from_query(text: &str) -> Result<Self, String> {
        each_of(text, |version| {
            let ok = version.split_once('.').is_some_and(|(a, b)| digits(a) && digits(b));
            ok.then_some(())
                .ok_or_else(|| format!("{version:?} is not major.minor, e.g. 12.8"))
        })
        .map(|()| Self)
    }
}

/// A `major` or `major.minor` CUDA version.
struct MinCudaVersion;

impl QueryValue for MinCudaVersion {
    fn from_query(text: &str) -> Result<Self, String> {
        let (major, minor) = text.split_once('.').unwrap_or((text, "0"));
        if digits(major) && digits(minor) {
            Ok(Self)
        } else {
            Err(format!("{text:?} is not a major or major.minor version"))
        }
    }
}

/// A vCPU count: a power of two from 2 to 512.
struct VcpuCount;

const VCPU_COUNTS: [u64; 9] = [2, 4, 8, 16, 32, 64, 128, 256, 512];

impl QueryValue for VcpuCount {
    fn from_query(text: &str) -> Result<Self, String> {
        match text.parse::<u64>() {
            Ok(n) if VCPU_COUNTS.contains(&n) => Ok(Self),
            _ => Err(format!("must be a power of two from 2 to 512 (got '{text}')")),
        }
    }
}

/// The schemas of the catalog's own value types: what their parsers accept.
fn pattern(pattern: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .into()
}

impl PartialSchema for CountryCodes {
    fn schema() -> RefOr<Schema> {
        pattern("^[A-Z]{2}(,[A-Z]{2})*$")
    }
}

impl PartialSchema for CudaVersions {
    fn schema() -> RefOr<Schema> {
        pattern("^[0-9]+\\.[0-9]+(,[0-9]+\\.[0-9]+)*$")
    }
}

impl PartialSchema for MinCudaVersion {
    fn schema() -> RefOr<Schema> {
        pattern("^[0-9]+(\\.[0-9]+)?$")
    }
}

impl PartialSchema for VcpuCount {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .enum_values(Some(VCPU_COUNTS))
            .into()
    }
}

impl ToSchema for CountryCodes {}
impl ToSchema for CudaVersions {}
impl ToSchema for MinCudaVersion {}
impl ToSchema for VcpuCount {}

fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|c| c.is_ascii_digit())
}

/// Checks each item of a comma-separated list (at least one); every bad item
/// is its own failure.
fn each_of(text: &str, check: impl Fn(&str) -> Result<(), String>) -> Result<(), String> {
    let items: Vec<&str> = text.split(',').map(str::trim).filter(|v| !v.is_empty()).collect();
    if items.is_empty() {
        return Err("must name at least one value".into());
    }
    let problems: Vec<String> = items.into_iter().filter_map(|item| check(item).err()).collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The GPU types' query.
#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct GpuQuery {
    /// AVAILABILITY
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    include: Option<List<Expansion>>,
    /// Comma-separated: POD, CLUSTER, SERVERLESS (required with include)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    product: Option<List<Product>>,
    /// GPUs per unit (with include); default 1
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    count: Option<Between<1, { u64::MAX }>>,
    /// SECURE or COMMUNITY (with include)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    cloud: Option<One<Cloud>>,
    /// Comma-separated ISO 3166-1 alpha-2 codes
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    country_codes: Option<CountryCodes>,
    /// Comma-separated major.minor versions
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    cuda_versions: Option<CudaVersions>,
    /// Lowest CUDA version
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    min_cuda_version: Option<MinCudaVersion>,
}

impl RequestQuery for GpuQuery {
    type Valid = Option<AvailabilityQuery>;

    fn combinations(given: &[&str], failures: &mut Vec<String>) {
        availability(given, &["product", "count", "cloud"], failures);
    }

    fn validate(self, _: &mut Vec<String>) -> Option<Self::Valid> {
        let products = self.product.unwrap_or_default().0;
        Some(self.include.map(|_| AvailabilityQuery {
            serverless: products.contains(&Product::Serverless),
            count: self.count.map_or(1, |n| n.0),
            cloud: self.cloud.map(|c| c.0),
            unknowable: self.country_codes.is_some() || self.cuda_versions.is_some() || self.min_cuda_version.is_some(),
        }))
    }
}

/// The CPU flavors' query.
#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct CpuQuery {
    /// AVAILABILITY
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    include: Option<List<Expansion>>,
    /// Comma-separated: POD, SERVERLESS (required with include)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    product: Option<List<CpuProduct>>,
    /// A power of two from 2 to 512 (with include)
    #[serde(default, deserialize_with = "query::value")]
    #[param(inline)]
    #[allow(dead_code)] // read for its rule only
    vcpu_count: Option<VcpuCount>,
}

impl RequestQuery for CpuQuery {
    type Valid = Option<AvailabilityQuery>;

    fn combinations(given: &[&str], failures: &mut Vec<String>) {
        availability(given, &["product", "vcpuCount"], failures);
    }

    fn validate(self, _: &mut Vec<String>) -> Option<Self::Valid> {
        let products = self.product.unwrap_or_default().0;
        Some(self.include.map(|_| AvailabilityQuery {
            serverless: products.contains(&CpuProduct::Serverless),
            count: 1,
            cloud: None,
            unknowable: false,
        }))
    }
}

/// The rules of `include=AVAILABILITY`: it needs a `product`, and the
/// availability options mean nothing without it.
fn availability(given: &[&str], options: &[&str], failures: &mut Vec<String>) {
    let include = given.contains(&"include");
    if include && !given.contains(&"product") {
        failures.push("product: required with include=AVAILABILITY (POD, CLUSTER or SERVERLESS)".into());
    }
    if !include {
        for name in given.iter().filter(|name| options.contains(name)) {
            failures.push(format!("{name}: valid only with include=AVAILABILITY"));
        }
    }
}

/// A GPU type as the catalog shows it: availability from the workers that
/// report it (Gantry runs serverless workers only: pods and clusters are
/// never available; each worker reports one GPU).
fn gpu_view(gpu: &GpuType, query: Option<&AvailabilityQuery>, workers: &[(String, u64, u64)]) -> serde_json::Value {
    let mut view = serde_json::to_value(gpu).unwrap_or_default();
    if let Some(query) = query {
        let cloud_ok = match query.cloud {
            Some(Cloud::Secure) => gpu.secure,
            Some(Cloud::Community) => gpu.community,
            None => true,
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
        GpuQuery,
    ),
    responses((status = 200, description = "OK")))]
pub async fn list_gpus(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = parse_query::<GpuQuery>(&req)?;
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
        GpuQuery,
    ),
    responses((status = 200, description = "OK")))]
pub async fn get_gpu(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = parse_query::<GpuQuery>(&req)?;
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
        CpuQuery,
    ),
    responses((status = 200, description = "OK")))]
pub async fn list_cpus(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = parse_query::<CpuQuery>(&req)?;
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
        CpuQuery,
    ),
    responses((status = 200, description = "OK")))]
pub async fn get_cpu(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::CatalogRead)?;
    let query = parse_query::<CpuQuery>(&req)?;
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
