use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::{TierError, VolumeType};
use gantry_volumes::{NetworkVolume, NewVolume, VolumeError, VolumeName, VolumeSize, VolumeUpdate};
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::body::{ObjectValidator, read_json};
use crate::middleware::Caller;
use crate::problem::ApiError;

const TIERS: [&str; 2] = ["STANDARD", "HIGH_PERFORMANCE"];

/// The documented list shape; `ListBody` writes it without copying the list.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ListNetworkVolumesResponse {
    #[schema(rename = "networkVolumes")]
    network_volumes: Vec<NetworkVolume>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListBody<'a> {
    network_volumes: &'a [NetworkVolume],
}

/// The creation request as documented; validation itself is done field by field.
#[derive(ToSchema)]
#[schema(as = CreateNetworkVolumeRequest)]
#[allow(dead_code)]
pub struct CreateNetworkVolumeRequest {
    /// Human-readable name: no control or bidirectional override characters
    #[schema(min_length = 1, max_length = 128, example = "my-dataset")]
    name: String,
    /// Storage to allocate in GB
    #[schema(minimum = 10, maximum = 4096, example = 50)]
    size: i64,
    /// Data center in which to create the volume; it must offer the tier
    #[schema(rename = "dataCenter", min_length = 1, example = "EU-RO-1")]
    data_center: String,
    /// Storage tier; omitted means the data center's default (primary) tier
    #[schema(rename = "type", required = false)]
    volume_type: VolumeType,
}

/// Only the provided fields change; at least one is required.
#[derive(ToSchema)]
#[schema(as = UpdateNetworkVolumeRequest)]
#[allow(dead_code)]
pub struct UpdateNetworkVolumeRequest {
    /// New human-readable name: no control or bidirectional override characters
    #[schema(min_length = 1, max_length = 128, required = false)]
    name: String,
    /// New size in GB; must not be smaller than the current size
    #[schema(minimum = 10, maximum = 4096, required = false)]
    size: i64,
}

impl From<VolumeError> for ApiError {
    fn from(err: VolumeError) -> Self {
        match err {
            VolumeError::NotFound => ApiError::NotFound("network volume not found".into()),
            VolumeError::SizeDecrease { current, .. } => ApiError::BadRequest {
                detail: err.to_string(),
                errors: vec![format!("$.size: must not be smaller than the current size ({current})")],
            },
            VolumeError::EmptyUpdate => ApiError::Unprocessable(vec![format!("$: {err}")]),
            VolumeError::Database(db) => ApiError::internal("network volume storage failed", &db),
        }
    }
}

#[utoipa::path(get, path = "/v2/network-volumes", operation_id = "listNetworkVolumes", tag = "Network Volumes",
    description = "Returns all network volumes owned by the authenticated user. Requires `volumes:read`.",
    responses((status = 200, description = "OK", body = ListNetworkVolumesResponse)))]
pub async fn list(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::VolumesRead)?;
    let list = state.volumes.list(&principal.user_id).await?;
    Ok(HttpResponse::Ok().json(ListBody { network_volumes: &list }))
}

#[utoipa::path(post, path = "/v2/network-volumes", operation_id = "createNetworkVolume", tag = "Network Volumes",
    description = "Creates a network volume in a data center of the catalog. Requires `volumes:write`.",
    request_body = CreateNetworkVolumeRequest,
    responses((status = 201, description = "Created", body = NetworkVolume)))]
pub async fn create(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::VolumesWrite)?;
    let body = read_json(&req, payload, state.body_limit).await?;
    let mut v = ObjectValidator::root(&body)?;
    v.only(&["name", "size", "dataCenter", "type"]);
    let name = v
        .string("name", true)
        .and_then(|s| v.check("name", VolumeName::parse(s)));
    let size = v
        .integer("size", true)
        .and_then(|n| v.check("size", VolumeSize::parse(n)));
    let data_center = v.string("dataCenter", true);
    let requested = v.one_of("type", false, &TIERS, VolumeType::parse);
    let tier_given_and_bad = body.get("type").is_some() && requested.is_none();
    let tier = match data_center {
        Some("") => {
            v.fail("dataCenter", "must not be empty");
            None
        }
        Some(dc) if !tier_given_and_bad => match state.catalog.volume_tier(dc, requested) {
            Ok(tier) => Some(tier),
            Err(TierError::UnknownDataCenter) => {
                v.fail("dataCenter", format!("unknown data center '{dc}'"));
                None
            }
            Err(TierError::NoVolumes) => {
                v.fail(
                    "dataCenter",
                    format!("data center '{dc}' does not offer network volumes"),
                );
                None
            }
            Err(err @ TierError::TierNotOffered { .. }) => {
                let asked = requested.map(VolumeType::as_str).unwrap_or_default();
                v.fail("type", format!("{asked}: {err} in '{dc}'"));
                None
            }
        },
        _ => None,
    };
    v.finish()?;
    let (Some(name), Some(size), Some(data_center), Some(volume_type)) = (name, size, data_center, tier) else {
        return Err(ApiError::internal(
            "create volume",
            &"validation passed with a missing field",
        ));
    };
    let new = NewVolume {
        name,
        size,
        data_center: data_center.to_string(),
        volume_type,
    };
    let volume = state.volumes.create(caller.user_id(), new).await?;
    Ok(HttpResponse::Created().json(volume))
}

#[utoipa::path(get, path = "/v2/network-volumes/{id}", operation_id = "getNetworkVolume", tag = "Network Volumes",
    description = "Returns one of the caller's network volumes. Requires `volumes:read`.",
    params(("id" = String, Path, description = "Network volume identifier")),
    responses((status = 200, description = "OK", body = NetworkVolume)))]
pub async fn get(state: web::Data<AppState>, caller: Caller, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::VolumesRead)?;
    let volume = state.volumes.get(&principal.user_id, &id).await?;
    Ok(HttpResponse::Ok().json(volume))
}

#[utoipa::path(patch, path = "/v2/network-volumes/{id}", operation_id = "updateNetworkVolume", tag = "Network Volumes",
    description = "Renames and/or grows a network volume; `size` may only increase, `dataCenter` and `type` never change. Requires `volumes:write`.",
    params(("id" = String, Path, description = "Network volume identifier")),
    request_body = UpdateNetworkVolumeRequest,
    responses((status = 200, description = "OK", body = NetworkVolume)))]
pub async fn update(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    caller.require(Scope::VolumesWrite)?;
    let body = read_json(&req, payload, state.body_limit).await?;
    let mut v = ObjectValidator::root(&body)?;
    v.only(&["name", "size"]);
    let update = VolumeUpdate {
        name: v
            .string("name", false)
            .and_then(|s| v.check("name", VolumeName::parse(s))),
        size: v
            .integer("size", false)
            .and_then(|n| v.check("size", VolumeSize::parse(n))),
    };
    if body.get("name").is_none() && body.get("size").is_none() {
        v.fail("", "at least one of name, size is required");
    }
    v.finish()?;
    let volume = state.volumes.update(caller.user_id(), &id, update).await?;
    Ok(HttpResponse::Ok().json(volume))
}

#[utoipa::path(delete, path = "/v2/network-volumes/{id}", operation_id = "deleteNetworkVolume", tag = "Network Volumes",
    description = "Permanently deletes a network volume. Its storage is charged up to the hour in progress \
first (volumes are charged by the started hour). Requires `volumes:write`.",
    params(("id" = String, Path, description = "Network volume identifier")),
    responses((status = 204, description = "Deleted. Response has no body.")))]
pub async fn delete(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::VolumesWrite)?;
    // Only the caller's own volume is accrued (another's id is answered
    // exactly like a missing one, by the delete below).
    if state.volumes.get(&principal.user_id, &id).await.is_ok() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        state.jobs.accrue_storage(now, Some(&id)).await?;
    }
    state.volumes.delete(&principal.user_id, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}
