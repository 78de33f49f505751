//! Billing: the caller's credit balance.
use actix_web::{HttpResponse, web};
use gantry_auth::Scope;
use gantry_billing::credit::usd_string;
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::middleware::Caller;
use crate::problem::ApiError;

/// A credit balance. Amounts are exact decimal strings in USD (6 decimals).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Balance {
    /// Credit added minus every charge.
    #[schema(example = "12.345678")]
    pub balance_usd: String,
    /// The most the caller's queued and running jobs may still cost.
    #[schema(example = "0.081920")]
    pub held_usd: String,
    /// `balanceUsd − heldUsd`: a job is accepted only while this is above zero
    /// (when the server requires credit).
    #[schema(example = "12.263758")]
    pub available_usd: String,
    /// Whether jobs are refused (`402`) without available credit.
    pub credit_required: bool,
}

#[utoipa::path(get, path = "/v2/billing/balance", operation_id = "getBalance", tag = "Billing",
    description = "The caller's credit balance in USD, what their jobs in flight may still cost, and what is \
available for new jobs. Top-ups are made by an operator (`gantry users add-credit EMAIL USD`); every completed \
job's cost is debited in the transaction that completes it. Requires `billing:read`.",
    responses((status = 200, description = "OK", body = Balance)))]
pub async fn balance(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::BillingRead)?;
    let (balance, held) = state.jobs.credit(&principal.user_id).await?;
    Ok(HttpResponse::Ok().json(Balance {
        balance_usd: usd_string(balance),
        held_usd: usd_string(held),
        available_usd: usd_string(balance.saturating_sub(held)),
        credit_required: state.jobs.config().require_credit,
    }))
}
