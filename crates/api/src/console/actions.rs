//! What the console changes: signing in and out, and the console's own API
//! (keys, the operator's actions). Everything else a page changes goes
//! through the REST API's own handlers (`/console/api/manage`, `/models`).
use actix_web::http::{StatusCode, header};
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use gantry_auth::{AuthError, ConsoleSession, Role, ScopeSet, SignInError, UserLimits};
use serde::Deserialize;
use serde_json::{Value, json};

use super::pages::{CredentialsForm, safe_next};
use super::session::{self, FORM_COOKIE, Signed, same_token};
use crate::problem::ApiError;
use crate::state::AppState;

#[derive(Deserialize)]
pub struct Credentials {
    #[serde(default)]
    form: String,
    #[serde(default)]
    next: Option<String>,
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
}

fn parse_form<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_urlencoded::from_bytes(body).map_err(|e| ApiError::BadRequest {
        detail: "the form could not be read".into(),
        errors: vec![e.to_string()],
    })
}

/// Whether the form came from a form this server rendered for this browser.
fn form_is_ours(req: &HttpRequest, sent: &str) -> bool {
    session::cookie(req, FORM_COOKIE).is_some_and(|cookie| !sent.is_empty() && same_token(&cookie, sent))
}

fn signed_in(req: &HttpRequest, state: &AppState, started: gantry_auth::StartedSession, next: &str) -> HttpResponse {
    let max_age = (state.console.session_ttl.as_secs()).max(1) as i64;
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, next.to_owned()))
        .append_header((
            header::SET_COOKIE,
            session::set_cookie(req, session::SESSION_COOKIE, &started.token, max_age),
        ))
        .append_header((header::SET_COOKIE, session::set_cookie(req, FORM_COOKIE, "", 0)))
        .finish()
}

pub async fn sign_in(req: HttpRequest, state: web::Data<AppState>, body: web::Bytes) -> Result<HttpResponse, ApiError> {
    let form: Credentials = parse_form(&body)?;
    let next = safe_next(form.next.as_deref());
    let again = |error: &str, status: StatusCode| {
        CredentialsForm {
            action: "/console/sign-in",
            title: "Sign in",
            next: &next,
            email: &form.email,
            error: Some(error),
            status,
            self_signup: state.console.self_signup,
        }
        .render(&req)
    };
    if !form_is_ours(&req, &form.form) {
        return Ok(again(
            "The form expired or did not come from this page; sign in again.",
            StatusCode::BAD_REQUEST,
        ));
    }
    if let Err(retry_after) = session::throttle(&state, &req, &form.email).await {
        let mut res = again(
            &format!("Too many sign-in attempts; try again in {retry_after} seconds."),
            StatusCode::TOO_MANY_REQUESTS,
        );
        res.headers_mut().insert(header::RETRY_AFTER, retry_after.into());
        return Ok(res);
    }
    match state.auth.check_password(&form.email, &form.password).await {
        Ok(user) => {
            let started = state
                .auth
                .start_session(&user, state.console.session_ttl)
                .await
                .map_err(|e| ApiError::internal("console session", &e))?;
            tracing::info!(user = %user.id, "console sign-in");
            Ok(signed_in(&req, &state, started, &next))
        }
        Err(SignInError::Refused) => Ok(again("Wrong email or password.", StatusCode::UNAUTHORIZED)),
        Err(SignInError::Auth(err)) => Err(ApiError::internal("console sign-in", &err)),
    }
}

pub async fn sign_up(req: HttpRequest, state: web::Data<AppState>, body: web::Bytes) -> Result<HttpResponse, ApiError> {
    if !state.console.self_signup {
        return Err(ApiError::NotFound("sign-up is off on this installation".into()));
    }
    let form: Credentials = parse_form(&body)?;
    let again = |error: &str, status: StatusCode| {
        CredentialsForm {
            action: "/console/sign-up",
            title: "Create an account",
            next: "/console",
            email: &form.email,
            error: Some(error),
            status,
            self_signup: true,
        }
        .render(&req)
    };
    if !form_is_ours(&req, &form.form) {
        return Ok(again("The form expired; try again.", StatusCode::BAD_REQUEST));
    }
    if let Err(retry_after) = session::throttle(&state, &req, &form.email).await {
        let mut res = again("Too many attempts; try again later.", StatusCode::TOO_MANY_REQUESTS);
        res.headers_mut().insert(header::RETRY_AFTER, retry_after.into());
        return Ok(res);
    }
    let length = form.password.chars().count();
    if !gantry_auth::PASSWORD_LENGTH.contains(&length) {
        return Ok(again(
            &format!(
                "A password needs {} to {} characters.",
                gantry_auth::PASSWORD_LENGTH.start(),
                gantry_auth::PASSWORD_LENGTH.end()
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
        ));
    }
    let user = match state.auth.create_user(&form.email).await {
        Ok(user) => user,
        Err(AuthError::InvalidEmail(_)) => {
            return Ok(again("That is not an email address.", StatusCode::UNPROCESSABLE_ENTITY));
        }
        Err(AuthError::DuplicateEmail(_)) => {
            return Ok(again(
                "An account with this email exists; sign in instead.",
                StatusCode::CONFLICT,
            ));
        }
        Err(err) => return Err(ApiError::internal("console sign-up", &err)),
    };
    state
        .auth
        .set_password(&user.email, &form.password)
        .await
        .map_err(|e| ApiError::internal("console sign-up", &e))?;
    let started = state
        .auth
        .start_session(&user, state.console.session_ttl)
        .await
        .map_err(|e| ApiError::internal("console session", &e))?;
    tracing::info!(user = %user.id, "console sign-up");
    Ok(signed_in(&req, &state, started, "/console"))
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

fn signed_out(req: &HttpRequest) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/console/sign-in?error=signed-out"))
        .insert_header((
            header::SET_COOKIE,
            session::set_cookie(req, session::SESSION_COOKIE, "", 0),
        ))
        .finish()
}

fn check_form_csrf(session: &ConsoleSession, body: &[u8]) -> Result<(), ApiError> {
    let form: CsrfForm = parse_form(body)?;
    if same_token(&form.csrf, &session.csrf) {
        Ok(())
    } else {
        Err(ApiError::Forbidden("missing or wrong CSRF token".into()))
    }
}

pub async fn sign_out(
    req: HttpRequest,
    Signed(session): Signed,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    check_form_csrf(&session, &body)?;
    if let Some(token) = session::cookie(&req, session::SESSION_COOKIE) {
        state
            .auth
            .end_session(&token)
            .await
            .map_err(|e| ApiError::internal("console sign-out", &e))?;
    }
    Ok(signed_out(&req))
}

pub async fn sign_out_everywhere(
    req: HttpRequest,
    Signed(session): Signed,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    check_form_csrf(&session, &body)?;
    let ended = state
        .auth
        .end_all_sessions(&session.user.id)
        .await
        .map_err(|e| ApiError::internal("console sign-out", &e))?;
    tracing::info!(user = %session.user.id, ended, "console sessions ended everywhere");
    Ok(signed_out(&req))
}

/// The session `api_authenticate` found for this request.
fn session_of(req: &HttpRequest) -> Result<ConsoleSession, ApiError> {
    req.extensions()
        .get::<ConsoleSession>()
        .cloned()
        .ok_or_else(|| ApiError::internal("console", &"no session on request"))
}

fn json_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::BadRequest {
            detail: "the body must be a JSON object".into(),
            errors: vec!["body: must be a JSON object".into()],
        }),
        Err(e) => Err(ApiError::BadRequest {
            detail: "the body is not valid JSON".into(),
            errors: vec![format!("body: {e}")],
        }),
    }
}

fn string_field(body: &serde_json::Map<String, Value>, name: &str, errors: &mut Vec<String>) -> Option<String> {
    match body.get(name) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errors.push(format!("{name}: must be a string"));
            None
        }
    }
}

/// `POST /console/api/keys` `{name?, scopes, expiresIn?}`: issues a key for
/// the signed-in user; the answer is the only place its secret appears.
pub async fn create_key(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let session = session_of(&req)?;
    let body = json_body(&body)?;
    let mut errors = Vec::new();
    let name = string_field(&body, "name", &mut errors).filter(|n| !n.trim().is_empty());
    if name
        .as_ref()
        .is_some_and(|n| n.chars().count() > 100 || n.chars().any(char::is_control))
    {
        errors.push("name: must be at most 100 characters, without control characters".into());
    }
    let scopes = match body.get("scopes") {
        Some(Value::Array(items)) => {
            let words: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            if words.len() != items.len() {
                errors.push("scopes: must be a list of scope names".into());
                ScopeSet::default()
            } else {
                ScopeSet::parse(&words.join(" ")).unwrap_or_else(|e| {
                    errors.push(format!("scopes: {e}"));
                    ScopeSet::default()
                })
            }
        }
        Some(Value::String(text)) => ScopeSet::parse(text).unwrap_or_else(|e| {
            errors.push(format!("scopes: {e}"));
            ScopeSet::default()
        }),
        _ => ScopeSet::default(),
    };
    if scopes.is_empty() && !errors.iter().any(|e| e.starts_with("scopes")) {
        errors.push("scopes: choose at least one scope".into());
    }
    let expires_in = match string_field(&body, "expiresIn", &mut errors).filter(|t| !t.is_empty()) {
        None => None,
        Some(text) => match gantry_auth::parse_duration(&text) {
            Ok(d) if d.as_secs() >= 60 => Some(d),
            Ok(_) => {
                errors.push("expiresIn: must be at least a minute".into());
                None
            }
            Err(e) => {
                errors.push(format!("expiresIn: {e}"));
                None
            }
        },
    };
    if let Some(unknown) = body
        .keys()
        .find(|k| !["name", "scopes", "expiresIn"].contains(&k.as_str()))
    {
        errors.push(format!("{unknown}: unknown field"));
    }
    if !errors.is_empty() {
        return Err(ApiError::Unprocessable(errors));
    }
    let issued = state
        .auth
        .issue_key(&session.user, scopes, expires_in, name)
        .await
        .map_err(|e| ApiError::internal("console key", &e))?;
    tracing::info!(user = %session.user.id, key = %issued.info.id, "console issued a key");
    Ok(HttpResponse::Created().json(json!({
        "id": issued.info.id,
        "key": issued.key.expose(),
        "prefix": issued.info.prefix,
        "lastFour": issued.info.last_four,
        "scopes": issued.info.scopes.to_storage(),
        "expiresAt": issued.info.expires_at,
    })))
}

pub async fn revoke_key(
    req: HttpRequest,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = session_of(&req)?;
    match state.auth.revoke_own_key(&session.user, &id).await {
        Ok(info) => Ok(HttpResponse::Ok().json(json!({"id": info.id, "revokedAt": info.revoked_at}))),
        Err(AuthError::NoSuchKey(id)) => Err(ApiError::NotFound(format!("no key '{id}'"))),
        Err(err) => Err(ApiError::internal("console revoke", &err)),
    }
}

fn require_admin(req: &HttpRequest) -> Result<ConsoleSession, ApiError> {
    let session = session_of(req)?;
    if session.user.role == Role::Admin {
        Ok(session)
    } else {
        Err(ApiError::Forbidden("this needs the admin role".into()))
    }
}

async fn target_user(state: &AppState, email: Option<String>, errors: &mut Vec<String>) -> Option<gantry_auth::User> {
    let email = email.filter(|e| !e.trim().is_empty());
    let Some(email) = email else {
        errors.push("email: required".into());
        return None;
    };
    match state.auth.find_user(&email).await {
        Ok(user) => Some(user),
        Err(AuthError::NoSuchUser(_) | AuthError::InvalidEmail(_)) => {
            errors.push(format!("email: no user with email '{email}'"));
            None
        }
        Err(err) => {
            tracing::error!(error = %err, "console user lookup failed");
            errors.push("email: could not be looked up right now".into());
            None
        }
    }
}

/// `POST /console/api/admin/credit` `{email, usd, reason?}` (admin).
pub async fn admin_credit(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let admin = require_admin(&req)?;
    let body = json_body(&body)?;
    let mut errors = Vec::new();
    let email = string_field(&body, "email", &mut errors);
    let amount = match string_field(&body, "usd", &mut errors) {
        Some(text) => match gantry_billing::credit::parse_usd(text.trim()) {
            Ok(n) if n > 0 => Some(n),
            Ok(_) => {
                errors.push("usd: must be more than zero".into());
                None
            }
            Err(e) => {
                errors.push(format!("usd: {e}"));
                None
            }
        },
        None => {
            errors.push("usd: required".into());
            None
        }
    };
    let reason = string_field(&body, "reason", &mut errors)
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "top-up".into());
    let user = target_user(&state, email, &mut errors).await;
    let (Some(user), Some(amount), true) = (user, amount, errors.is_empty()) else {
        return Err(ApiError::Unprocessable(errors));
    };
    let balance = gantry_billing::credit::add_credit(&state.db, &user.id, amount, &reason, gantry_jobs::now_ms())
        .await
        .map_err(|e| ApiError::internal("console credit", &e))?;
    tracing::info!(admin = %admin.user.id, user = %user.id, amount, "console credit top-up");
    Ok(HttpResponse::Ok().json(json!({
        "email": user.email,
        "balanceUsd": gantry_billing::credit::usd_string(balance),
    })))
}

fn limit_field(body: &serde_json::Map<String, Value>, name: &str, errors: &mut Vec<String>) -> Option<u64> {
    match body.get(name) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) => Some(n),
            None => {
                errors.push(format!(
                    "{name}: must be a whole number of requests, or empty for the default"
                ));
                None
            }
        },
    }
}

/// `POST /console/api/admin/limits` `{email, minute?, hour?, day?, exempt?}` (admin).
pub async fn admin_limits(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let admin = require_admin(&req)?;
    let body = json_body(&body)?;
    let mut errors = Vec::new();
    let email = string_field(&body, "email", &mut errors);
    let limits = UserLimits {
        minute: limit_field(&body, "minute", &mut errors),
        hour: limit_field(&body, "hour", &mut errors),
        day: limit_field(&body, "day", &mut errors),
        exempt: body.get("exempt").and_then(Value::as_bool).unwrap_or(false),
    };
    let user = target_user(&state, email, &mut errors).await;
    let (Some(user), true) = (user, errors.is_empty()) else {
        return Err(ApiError::Unprocessable(errors));
    };
    let user = state
        .auth
        .set_limits(&user.email, limits)
        .await
        .map_err(|e| ApiError::internal("console limits", &e))?;
    tracing::info!(admin = %admin.user.id, user = %user.id, "console set rate limits");
    Ok(HttpResponse::Ok().json(json!({
        "email": user.email,
        "minute": user.limits.minute,
        "hour": user.limits.hour,
        "day": user.limits.day,
        "exempt": user.limits.exempt,
    })))
}

/// `POST /console/api/admin/role` `{email, role}` (admin). An admin cannot
/// take the role from themselves (someone must stay able to give it back).
pub async fn admin_role(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let admin = require_admin(&req)?;
    let body = json_body(&body)?;
    let mut errors = Vec::new();
    let email = string_field(&body, "email", &mut errors);
    let role = match string_field(&body, "role", &mut errors).map(|r| Role::parse(&r)) {
        Some(Ok(role)) => Some(role),
        Some(Err(e)) => {
            errors.push(format!("role: {e}"));
            None
        }
        None => {
            errors.push("role: required".into());
            None
        }
    };
    let user = target_user(&state, email, &mut errors).await;
    if let (Some(user), Some(Role::User)) = (&user, role)
        && user.id == admin.user.id
    {
        errors.push("role: you cannot take the admin role from yourself".into());
    }
    let (Some(user), Some(role), true) = (user, role, errors.is_empty()) else {
        return Err(ApiError::Unprocessable(errors));
    };
    let user = state
        .auth
        .set_role(&user.email, role)
        .await
        .map_err(|e| ApiError::internal("console role", &e))?;
    tracing::info!(admin = %admin.user.id, user = %user.id, role = role.as_str(), "console set a role");
    Ok(HttpResponse::Ok().json(json!({"email": user.email, "role": role.as_str()})))
}
