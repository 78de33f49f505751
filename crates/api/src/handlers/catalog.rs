use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_catalog::{Compliance, DataCenterFilter, DataCenterInclude, DataCenterRegion, DataCenterView, VolumeType};
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::body::query_list;
use crate::middleware::Caller;
use crate::problem::ApiError;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListDataCentersResponse {
    pub data_centers: Vec<DataCenterView>,
}

/// Splits a query string into known parameters; unknown ones are an error, not a silent no-op.
fn query_pairs(req: &HttpRequest, known: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
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
