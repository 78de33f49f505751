use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::{Catalog, TierError, VolumeType};
use gantry_volumes::{NetworkVolume, NewVolume, VolumeName, VolumeSize, VolumeUpdate};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::body::{Failures, RequestBody, present, read_body};
use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::state::AppState;

/// The caller's network volumes.
// Serialized from the service's list by reference: no copy of the list.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListNetworkVolumesResponse<'a> {
    #[schema(value_type = Vec<NetworkVolume>)]
    network_volumes: &'a [NetworkVolume],
}

/// The creation request.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateNetworkVolumeRequest {
    /// Human-readable name: no control or bidirectional override characters
    #[schema(value_type = String, min_length = 1, max_length = 128, example = "my-dataset")]
    name: VolumeName,
    /// Storage to allocate in GB
    #[schema(value_type = i64, minimum = 10, maximum = 4096, example = 50)]
    size: VolumeSize,
    /// Data center in which to create the volume; it must offer the tier
    #[schema(value_type = String, min_length = 1, example = "EU-RO-1")]
    data_center: NonEmpty,
    /// Storage tier; omitted means the data center's default (primary) tier
    #[serde(rename = "type", default, deserialize_with = "present")]
    #[schema(nullable = false)]
    volume_type: Option<VolumeType>,
}

/// A string that is not empty.
#[derive(Deserialize)]
#[serde(try_from = "String")]
pub struct NonEmpty(String);

impl TryFrom<String> for NonEmpty {
    type Error = &'static str;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        if text.is_empty() {
            Err("must not be empty")
        } else {
            Ok(Self(text))
        }
    }
}

impl RequestBody for CreateNetworkVolumeRequest {
    type Context = Catalog;
    type Valid = NewVolume;

    /// The data center must exist and offer the tier (its default one when
    /// none is named).
    fn validate(self, catalog: &Catalog, failures: &mut Failures) -> Option<NewVolume> {
        let dc = self.data_center.0;
        let volume_type = match catalog.volume_tier(&dc, self.volume_type) {
            Ok(tier) => tier,
            Err(TierError::UnknownDataCenter) => {
                failures.fail("dataCenter", format!("unknown data center '{dc}'"));
                return None;
            }
            Err(TierError::NoVolumes) => {
                failures.fail(
                    "dataCenter",
                    format!("data center '{dc}' does not offer network volumes"),
                );
                return None;
            }
            Err(err @ TierError::TierNotOffered { .. }) => {
                let asked = self.volume_type.map(VolumeType::as_str).unwrap_or_default();
                failures.fail("type", format!("{asked}: {err} in '{dc}'"));
                return None;
            }
        };
        Some(NewVolume {
            name: self.name,
            size: self.size,
            data_center: dc,
            volume_type,
        })
    }
}

/// Only the provided fields change; at least one is required.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(min_properties = 1)]
pub struct UpdateNetworkVolumeRequest {
    /// New human-readable name: no control or bidirectional override characters
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = String, nullable = false, min_length = 1, max_length = 128)]
    name: Option<VolumeName>,
    /// New size in GB; must not be smaller than the current size
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = i64, nullable = false, minimum = 10, maximum = 4096)]
    size: Option<VolumeSize>,
}

impl RequestBody for UpdateNetworkVolumeRequest {
    const AT_LEAST_ONE_OF: &'static [&'static str] = &["name", "size"];
    type Context = ();
    type Valid = VolumeUpdate;

    fn validate(self, _: &(), _: &mut Failures) -> Option<VolumeUpdate> {
        Some(VolumeUpdate {
            name: self.name,
            size: self.size,
        })
    }
}

#[utoipa::path(get, path = "/v2/network-volumes", operation_id = "listNetworkVolumes", tag = "Network Volumes",
    description = "Returns all network volumes owned by the authenticated user. Requires `volumes:read`.",
    responses((status = 200, description = "OK", body = ListNetworkVolumesResponse)))]
pub async fn list(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::VolumesRead)?;
    let list = state.volumes.list(&principal.user_id).await?;
    Ok(HttpResponse::Ok().json(ListNetworkVolumesResponse { network_volumes: &list }))
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
    let new = read_body::<CreateNetworkVolumeRequest>(&req, payload, state.body_limit, &state.catalog).await?;
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
    let update = read_body::<UpdateNetworkVolumeRequest>(&req, payload, state.body_limit, &()).await?;
    let volume = state.volumes.update(caller.user_id(), &id, update).await?;
    Ok(HttpResponse::Ok().json(volume))
}

#[utoipa::path(delete, path = "/v2/network-volumes/{id}", operation_id = "deleteNetworkVolume", tag = "Network Volumes",
    description = "Permanently deletes a network volume. Its storage is charged up to the hour in progress \
first (volumes are charged by the started hour), and its files are removed. A volume a pod mounts is 409 until \
the pod is terminated, and one a serverless endpoint's workers mount is 409 while the endpoint has it. Requires `volumes:write`.",
    params(("id" = String, Path, description = "Network volume identifier")),
    responses((status = 204, description = "Deleted. Response has no body.")))]
pub async fn delete(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::VolumesWrite)?;
    let users = state.containers.pods_using_volume(&principal.user_id, &id).await?;
    if !users.is_empty() {
        return Err(ApiError::Conflict(format!(
            "the volume is mounted by pod {}: terminate or delete it first",
            users.join(", ")
        )));
    }
    let endpoints = state.containers.endpoints_using_volume(&principal.user_id, &id).await?;
    if !endpoints.is_empty() {
        return Err(ApiError::Conflict(format!(
            "the volume is mounted by the workers of endpoint {}: remove it from their networkVolumes or delete them first",
            endpoints.join(", ")
        )));
    }
    // Only the caller's own volume is accrued (another's id is answered
    // exactly like a missing one, by the delete below).
    if state.volumes.get(&principal.user_id, &id).await.is_ok() {
        state.jobs.accrue_storage(gantry_jobs::now_ms(), Some(&id)).await?;
    }
    state.volumes.delete(&principal.user_id, &id).await?;
    // Its files go with it (pods mounted it as an engine volume).
    if let Some(runtime) = state.fleet.as_ref().and_then(|fleet| fleet.runtime().cloned()) {
        let name = gantry_containers::pods::network_volume_name(&id);
        if let Err(error) = runtime.remove_volume(&name).await {
            tracing::warn!(volume = %name, %error, "the volume's files could not be removed");
        }
    }
    Ok(HttpResponse::NoContent().finish())
}
