//! The console's pages, rendered from the services on each request.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Role;
use gantry_catalog::ModelKind;
use gantry_jobs::entity::job;
use serde::Deserialize;
use serde_json::Value;

use super::html::{self, bar_chart, esc, page, usd};
use super::session::{self, FORM_COOKIE, Signed};
use crate::problem::ApiError;
use crate::state::AppState;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    gantry_jobs::now_ms()
}

fn internal(what: &'static str) -> impl Fn(sea_orm::DbErr) -> ApiError {
    move |err| ApiError::internal(what, &err)
}

pub async fn asset(name: web::Path<String>) -> HttpResponse {
    let (body, kind) = match name.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        _ => {
            return HttpResponse::NotFound()
                .content_type("text/plain")
                .body("no such asset");
        }
    };
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, kind))
        .insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .body(body)
}

pub async fn not_found(signed: Option<Signed>) -> HttpResponse {
    let body = "<p>There is no such page.</p><p><a href=\"/console\">Back to the overview</a></p>";
    let mut res = match signed {
        Some(Signed(session)) => page(&session, "", "Not found", body),
        None => html::html(html::bare_page("Not found", body)),
    };
    *res.status_mut() = actix_web::http::StatusCode::NOT_FOUND;
    res
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
    error: Option<String>,
}

/// Where to go after signing in: a console path only (no open redirect).
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with("/console")
                && !path.starts_with("//")
                && !path.contains("\\")
                && !path.chars().any(char::is_control) =>
        {
            path.to_owned()
        }
        _ => "/console".to_owned(),
    }
}

/// A fresh form token, set as a cookie and echoed in the form.
fn form_token() -> String {
    use rand::RngExt;
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sign-in or sign-up form, with a fresh form token (cookie and field).
pub struct CredentialsForm<'a> {
    pub action: &'a str,
    pub title: &'a str,
    pub next: &'a str,
    pub email: &'a str,
    pub error: Option<&'a str>,
    pub status: actix_web::http::StatusCode,
    pub self_signup: bool,
}

impl CredentialsForm<'_> {
    pub fn render(&self, req: &HttpRequest) -> HttpResponse {
        let token = form_token();
        let mut body = String::new();
        if let Some(error) = self.error {
            let _ = write!(
                body,
                "<p class=\"error\" role=\"alert\" id=\"form-error\">{}</p>",
                esc(error)
            );
        }
        let (button, autocomplete, other) = if self.action.ends_with("sign-up") {
            (
                "Create account",
                "new-password",
                "<p>Have an account? <a href=\"/console/sign-in\">Sign in</a></p>",
            )
        } else if self.self_signup {
            (
                "Sign in",
                "current-password",
                "<p>No account? <a href=\"/console/sign-up\">Create one</a></p>",
            )
        } else {
            (
                "Sign in",
                "current-password",
                "<p>Accounts are made by your operator.</p>",
            )
        };
        let _ = write!(
            body,
            "<form method=\"post\" action=\"{action}\" class=\"stack\">\
             <input type=\"hidden\" name=\"form\" value=\"{token}\"><input type=\"hidden\" name=\"next\" value=\"{next}\">\
             <label for=\"email\">Email</label><input id=\"email\" name=\"email\" type=\"email\" autocomplete=\"username\" required value=\"{email}\">\
             <label for=\"password\">Password</label><input id=\"password\" name=\"password\" type=\"password\" autocomplete=\"{autocomplete}\" required>\
             <button type=\"submit\">{button}</button></form>{other}",
            action = self.action,
            next = esc(self.next),
            email = esc(self.email),
        );
        HttpResponse::build(self.status)
            .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
            .insert_header((header::SET_COOKIE, session::set_cookie(req, FORM_COOKIE, &token, 1800)))
            .body(html::bare_page(self.title, &body))
    }
}

pub async fn sign_in_form(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<NextQuery>,
    signed: Option<Signed>,
) -> HttpResponse {
    let next = safe_next(query.next.as_deref());
    if signed.is_some() {
        return HttpResponse::SeeOther()
            .insert_header((header::LOCATION, next))
            .finish();
    }
    let error = query.error.as_deref().map(|e| match e {
        "signed-out" => "You are signed out.",
        _ => "Sign in again.",
    });
    CredentialsForm {
        action: "/console/sign-in",
        title: "Sign in",
        next: &next,
        email: "",
        error,
        status: actix_web::http::StatusCode::OK,
        self_signup: state.console.self_signup,
    }
    .render(&req)
}

pub async fn sign_up_form(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if !state.console.self_signup {
        return not_found(None).await;
    }
    CredentialsForm {
        action: "/console/sign-up",
        title: "Create an account",
        next: "/console",
        email: "",
        error: None,
        status: actix_web::http::StatusCode::OK,
        self_signup: true,
    }
    .render(&req)
}

/// One charge of a user: when, what for (a model, endpoint, pod or volume), its kind, micro-USD.
struct Spend {
    at: i64,
    subject: String,
    kind: &'static str,
    micro_usd: i64,
}

/// A user's charges from `from` to `to`, summed per bucket of `size` ms (in
/// the database: a page reads one row per bucket and subject, however many
/// jobs there were), each with the start of its bucket.
async fn spend(state: &AppState, user: &str, from: i64, to: i64, size: i64) -> Result<Vec<Spend>, ApiError> {
    let charges = gantry_billing::history::charges_by_bucket(&state.db, user, from, to, size)
        .await
        .map_err(internal("console billing"))?;
    let mut out: Vec<Spend> = charges
        .into_iter()
        .map(|(at, unit, subject, micro_usd)| Spend {
            at,
            kind: match unit.as_str() {
                gantry_billing::history::GPU_WORKER_SECONDS | gantry_billing::history::CPU_WORKER_SECONDS => {
                    "endpoint workers"
                }
                // A pod's running time and its disk while stopped.
                gantry_billing::history::GPU_POD_SECONDS
                | gantry_billing::history::CPU_POD_SECONDS
                | gantry_billing::history::POD_DISK_SECONDS => "pod",
                _ => "model",
            },
            subject,
            micro_usd,
        })
        .collect();
    let window = gantry_billing::history::Window {
        start: from,
        end: to,
        bucket: gantry_billing::history::BucketSize::Hour,
    };
    let storage = gantry_billing::history::storage_charges(&state.db, user, &window, None)
        .await
        .map_err(internal("console storage charges"))?;
    out.extend(storage.into_iter().map(|(at, volume, _, micro_usd)| Spend {
        at,
        subject: volume,
        kind: "storage",
        micro_usd,
    }));
    out.sort_by_key(|s| s.at);
    Ok(out)
}

fn status_badge(status: &str) -> String {
    format!(
        "<span class=\"status s-{}\">{}</span>",
        esc(&status.to_ascii_lowercase()),
        esc(status)
    )
}

fn jobs_table(rows: &[job::Model], empty: &str) -> String {
    if rows.is_empty() {
        return format!(
            "<p class=\"muted\">{empty} Try a model in the <a href=\"/console/playground\">playground</a>.</p>"
        );
    }
    let mut out = String::with_capacity(rows.len() * 400);
    out.push_str(
        "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><caption class=\"sr\">Jobs</caption><thead><tr><th scope=\"col\">Job</th>\
         <th scope=\"col\">Model</th><th scope=\"col\">Status</th><th scope=\"col\">Submitted</th>\
         <th scope=\"col\">Run time</th><th scope=\"col\">Cost</th></tr></thead><tbody>",
    );
    for row in rows {
        let run = match (row.started_at_ms, row.completed_at_ms) {
            (Some(s), Some(c)) => html::duration(c - s),
            (Some(_), None) => "running".into(),
            _ => "–".into(),
        };
        let _ = write!(
            out,
            "<tr><td><a href=\"/console/jobs/{m}/{id}\"><code>{short}</code></a></td><td>{m}</td><td>{status}</td>\
             <td>{at}</td><td>{run}</td><td>{cost}</td></tr>",
            m = esc(&row.model),
            id = esc(&row.id),
            short = esc(&row.id[..row.id.len().min(13)]),
            status = status_badge(&row.status),
            at = html::time(row.created_at_ms),
            cost = row.cost_micro_usd.map_or_else(|| "–".into(), usd),
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

pub async fn overview(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let user = &session.user.id;
    let (balance, held) = state.census.credit(user).await?;
    let now = now_ms();
    let today = now - now.rem_euclid(DAY_MS);
    let from = today - 29 * DAY_MS;
    let charges = spend(&state, user, from, now + 1, DAY_MS).await?;
    let mut days: Vec<(String, i64)> = (0..30)
        .map(|i| (html::time(from + i * DAY_MS)[..10].to_owned(), 0))
        .collect();
    let mut total = 0;
    for charge in &charges {
        let day = ((charge.at - from) / DAY_MS) as usize;
        if let Some(slot) = days.get_mut(day) {
            slot.1 += charge.micro_usd;
            total += charge.micro_usd;
        }
    }
    let running = state.jobs.recent(user, 20, true).await?;
    let endpoints = state
        .containers
        .list_endpoints(user)
        .await
        .map_err(|e| ApiError::internal("console endpoints", &e))?;
    let pods = state
        .containers
        .list_pods(user)
        .await
        .map_err(|e| ApiError::internal("console pods", &e))?;
    let mut body = String::with_capacity(8192);
    let _ = write!(
        body,
        "<section class=\"cards\" aria-label=\"Account\">\
         <div class=\"card\"><h2>Credit</h2><p class=\"big\" id=\"balance\">{}</p><p class=\"muted\">{} held by jobs in flight</p></div>\
         <div class=\"card\"><h2>Spend, last 30 days</h2><p class=\"big\" id=\"spend\">{}</p><p class=\"muted\"><a href=\"/console/billing\">Billing history</a></p></div>\
         <div class=\"card\"><h2>Running now</h2><p class=\"big\">{}</p><p class=\"muted\">jobs queued or running</p></div></section>",
        usd(balance),
        usd(held),
        usd(total),
        running.len()
    );
    body.push_str(&bar_chart("Spend per day, last 30 days (USD)", &days, usd));
    body.push_str("<h2>Jobs running now</h2>");
    body.push_str(&jobs_table(&running, "No jobs are queued or running."));
    body.push_str("<h2>Endpoints</h2>");
    if endpoints.is_empty() {
        body.push_str("<p class=\"muted\">No serverless endpoints.</p>");
    } else {
        body.push_str("<ul>");
        for e in &endpoints {
            let _ = write!(
                body,
                "<li><code>{}</code> {} ({}, {}–{} workers)</li>",
                esc(&e.id),
                esc(&e.spec.name),
                esc(&e.spec.container.image),
                e.spec.workers.min,
                e.spec.workers.max
            );
        }
        body.push_str("</ul>");
    }
    body.push_str("<h2>Pods</h2>");
    if pods.is_empty() {
        body.push_str("<p class=\"muted\">No pods.</p>");
    } else {
        body.push_str("<ul>");
        for p in &pods {
            let _ = write!(
                body,
                "<li><code>{}</code> {} {}</li>",
                esc(&p.id),
                esc(&p.name),
                status_badge(p.status.as_str())
            );
        }
        body.push_str("</ul>");
    }
    let _ = write!(
        body,
        "<h2>Account</h2><p>Signed in as {} until {}.</p>\
         <form method=\"post\" action=\"/console/sign-out-everywhere\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button type=\"submit\">Sign out on every device</button></form>",
        esc(&session.user.email),
        html::time(session.expires_at_ms),
        esc(&session.csrf)
    );
    Ok(page(&session, "/console", "Overview", &body))
}

pub async fn keys(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let keys = state
        .auth
        .list_keys(&session.user)
        .await
        .map_err(|e| ApiError::internal("console keys", &e))?;
    let now = gantry_auth::unix_now();
    let mut body = String::with_capacity(4096);
    body.push_str(
        "<section aria-labelledby=\"new-key\"><h2 id=\"new-key\">Create a key</h2>\
         <form class=\"stack\" data-api=\"/console/api/keys\" data-method=\"POST\" data-then=\"show-key\" novalidate>\
         <label for=\"key-name\">Name</label><input id=\"key-name\" name=\"name\" maxlength=\"100\" aria-describedby=\"err-name\">\
         <p class=\"field-error\" id=\"err-name\" data-error-for=\"name\"></p>\
         <fieldset><legend>Scopes</legend>",
    );
    for scope in gantry_auth::Scope::ALL {
        let name = scope.as_str();
        let _ = write!(
            body,
            "<label class=\"check\"><input type=\"checkbox\" name=\"scopes\" value=\"{name}\" checked> {name}</label>"
        );
    }
    body.push_str(
        "<p class=\"field-error\" data-error-for=\"scopes\"></p></fieldset>\
         <label for=\"key-expiry\">Expires</label><select id=\"key-expiry\" name=\"expiresIn\">\
         <option value=\"\">Never</option><option value=\"1d\">In a day</option><option value=\"30d\" selected>In 30 days</option>\
         <option value=\"90d\">In 90 days</option><option value=\"365d\">In a year</option></select>\
         <p class=\"field-error\" data-error-for=\"expiresIn\"></p>\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p>\
         <button type=\"submit\">Create key</button></form>\
         <div id=\"key-once\" class=\"once\" hidden><p><strong>Your new key.</strong> It is shown only this once: copy it now.</p>\
         <p><code id=\"key-value\"></code></p><button type=\"button\" data-copy=\"key-value\">Copy</button> \
         <a href=\"/console/keys\">Done</a></div></section><h2>Your keys</h2>",
    );
    if keys.is_empty() {
        body.push_str("<p class=\"muted\">No keys yet.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">Name</th><th scope=\"col\">Key</th>\
             <th scope=\"col\">Scopes</th><th scope=\"col\">Created</th><th scope=\"col\">Last used</th>\
             <th scope=\"col\">Expires</th><th scope=\"col\">State</th><th scope=\"col\"><span class=\"sr\">Actions</span></th></tr></thead><tbody>",
        );
        for key in keys.iter().rev() {
            let state_text = match (key.revoked_at, key.expires_at) {
                (Some(_), _) => "revoked",
                (None, Some(at)) if at <= now => "expired",
                _ => "active",
            };
            let action = if state_text == "active" {
                format!(
                    "<button type=\"button\" data-api=\"/console/api/keys/{id}\" data-method=\"DELETE\" \
                     data-confirm=\"Revoke this key? Requests with it fail from now on.\">Revoke <span class=\"sr\">{name}</span></button>",
                    id = esc(&key.id),
                    name = esc(key.name.as_deref().unwrap_or(&key.prefix))
                )
            } else {
                String::new()
            };
            let _ = write!(
                body,
                "<tr><td>{name}</td><td><code>{prefix}…{last}</code></td><td>{scopes}</td><td>{created}</td>\
                 <td>{used}</td><td>{expires}</td><td>{state_text}</td><td>{action}</td></tr>",
                name = esc(key.name.as_deref().unwrap_or("")),
                prefix = esc(&key.prefix),
                last = esc(&key.last_four),
                scopes = esc(&key.scopes.to_storage()),
                created = html::time(key.created_at * 1000),
                used = key
                    .last_used_at
                    .map_or_else(|| "never".into(), |at| html::time(at * 1000)),
                expires = key
                    .expires_at
                    .map_or_else(|| "never".into(), |at| html::time(at * 1000)),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    Ok(page(&session, "/console/keys", "API keys", &body))
}

pub async fn volumes(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let volumes = state.volumes.list(&session.user.id).await?;
    let centers: Vec<String> = state
        .catalog
        .list(&gantry_catalog::DataCenterFilter::default())
        .map(|d| d.id.clone())
        .collect();
    let mut body = String::with_capacity(4096);
    body.push_str(
        "<section aria-labelledby=\"new-volume\"><h2 id=\"new-volume\">Create a volume</h2>\
         <form class=\"stack\" data-api=\"/console/api/manage/v2/network-volumes\" data-method=\"POST\" novalidate>\
         <label for=\"vol-name\">Name</label><input id=\"vol-name\" name=\"name\" required aria-describedby=\"err-vol-name\">\
         <p class=\"field-error\" id=\"err-vol-name\" data-error-for=\"name\"></p>\
         <label for=\"vol-size\">Size (GB)</label><input id=\"vol-size\" name=\"size\" type=\"number\" data-type=\"number\" value=\"10\" aria-describedby=\"err-vol-size\">\
         <p class=\"field-error\" id=\"err-vol-size\" data-error-for=\"size\"></p>\
         <label for=\"vol-dc\">Data center</label><select id=\"vol-dc\" name=\"dataCenter\">",
    );
    for id in &centers {
        let _ = write!(body, "<option>{}</option>", esc(id));
    }
    body.push_str(
        "</select><p class=\"field-error\" data-error-for=\"dataCenter\"></p>\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p><button type=\"submit\">Create volume</button></form></section>\
         <h2>Your volumes</h2>",
    );
    if volumes.is_empty() {
        body.push_str("<p class=\"muted\">No network volumes.</p>");
    }
    for v in volumes.iter() {
        let id = esc(&v.id);
        let _ = write!(
            body,
            "<article class=\"row\" aria-label=\"Volume {name}\"><h3><span class=\"vol-name\">{name}</span> <code>{id}</code></h3>\
             <p>{size} GB · {dc} · {kind}</p>\
             <form class=\"inline\" data-api=\"/console/api/manage/v2/network-volumes/{id}\" data-method=\"PATCH\" novalidate>\
             <label for=\"rn-{id}\">Name</label><input id=\"rn-{id}\" name=\"name\" value=\"{name}\">\
             <label for=\"sz-{id}\">Size (GB)</label><input id=\"sz-{id}\" name=\"size\" type=\"number\" data-type=\"number\" value=\"{size}\">\
             <button type=\"submit\">Save</button>\
             <p class=\"field-error\" data-error-for=\"name\"></p><p class=\"field-error\" data-error-for=\"size\"></p>\
             <p class=\"error\" role=\"alert\" data-error-for=\"\"></p></form>\
             <button type=\"button\" class=\"danger\" data-api=\"/console/api/manage/v2/network-volumes/{id}\" data-method=\"DELETE\" \
             data-confirm=\"Delete this volume and its data?\">Delete <span class=\"sr\">{name}</span></button></article>",
            name = esc(&v.name),
            size = v.size,
            dc = esc(&v.data_center),
            kind = esc(v.volume_type.as_str()),
        );
    }
    Ok(page(&session, "/console/volumes", "Network volumes", &body))
}

#[derive(Deserialize)]
pub struct BillingQuery {
    bucket: Option<String>,
    /// `subject`: the CSV has one row per bucket, kind and model, endpoint,
    /// pod or volume instead of one row per bucket.
    by: Option<String>,
}

/// A CSV cell: quoted when it must be, and never read as a formula by a spreadsheet.
fn csv_cell(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

struct Bucketed {
    labels: Vec<(i64, String)>,
    /// Per bucket: kind -> micro-USD.
    rows: Vec<BTreeMap<&'static str, i64>>,
    by_subject: BTreeMap<(String, &'static str), i64>,
    /// (bucket start, kind, subject) -> micro-USD.
    detail: BTreeMap<(i64, &'static str, String), i64>,
}

async fn bucketed(state: &AppState, user: &str, hourly: bool) -> Result<Bucketed, ApiError> {
    let now = now_ms();
    let (size, count) = if hourly { (3_600_000, 48) } else { (DAY_MS, 30) };
    let first = now - now.rem_euclid(size) - (count - 1) * size;
    let charges = spend(state, user, first, now + 1, size).await?;
    let labels: Vec<(i64, String)> = (0..count)
        .map(|i| {
            let at = first + i * size;
            let text = html::time(at);
            (
                at,
                if hourly {
                    text[..16].to_owned()
                } else {
                    text[..10].to_owned()
                },
            )
        })
        .collect();
    let mut rows = vec![BTreeMap::new(); count as usize];
    let mut by_subject = BTreeMap::new();
    let mut detail = BTreeMap::new();
    for c in charges {
        let i = ((c.at - first) / size) as usize;
        if let Some(row) = rows.get_mut(i) {
            *row.entry(c.kind).or_insert(0) += c.micro_usd;
            *detail
                .entry((first + i as i64 * size, c.kind, c.subject.clone()))
                .or_insert(0) += c.micro_usd;
            *by_subject.entry((c.subject, c.kind)).or_insert(0) += c.micro_usd;
        }
    }
    Ok(Bucketed {
        labels,
        rows,
        by_subject,
        detail,
    })
}

const KINDS: [&str; 4] = ["model", "endpoint workers", "pod", "storage"];

pub async fn billing(
    Signed(session): Signed,
    state: web::Data<AppState>,
    query: web::Query<BillingQuery>,
) -> Result<HttpResponse, ApiError> {
    let hourly = query.bucket.as_deref() == Some("hour");
    let data = bucketed(&state, &session.user.id, hourly).await?;
    let bars: Vec<(String, i64)> = data
        .labels
        .iter()
        .zip(&data.rows)
        .map(|((_, label), row)| (label.clone(), row.values().sum()))
        .collect();
    let mut body = String::with_capacity(16384);
    let bucket = if hourly { "hour" } else { "day" };
    let _ = write!(
        body,
        "<nav class=\"tabs\" aria-label=\"Bucket size\"><a href=\"/console/billing?bucket=day\"{}>By day (30 days)</a>\
         <a href=\"/console/billing?bucket=hour\"{}>By hour (48 hours)</a>\
         <a href=\"/console/billing.csv?bucket={bucket}\" download>Export CSV</a>\
         <a href=\"/console/billing.csv?bucket={bucket}&amp;by=subject\" download>Export CSV by model, endpoint, pod and volume</a></nav>",
        if hourly { "" } else { " aria-current=\"page\"" },
        if hourly { " aria-current=\"page\"" } else { "" },
    );
    body.push_str(&bar_chart(&format!("Spend per {bucket} (USD)"), &bars, usd));
    body.push_str("<h2>By model, endpoint, pod and volume</h2>");
    if data.by_subject.is_empty() {
        body.push_str("<p class=\"muted\">Nothing charged in this window.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">What</th><th scope=\"col\">Kind</th>\
             <th scope=\"col\">Amount</th></tr></thead><tbody>",
        );
        for ((subject, kind), amount) in &data.by_subject {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{kind}</td><td>{}</td></tr>",
                esc(subject),
                usd(*amount)
            );
        }
        body.push_str("</tbody></table></div>");
    }
    let _ = write!(
        body,
        "<h2>Per {bucket}</h2><div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">{bucket}</th>"
    );
    for kind in KINDS {
        let _ = write!(body, "<th scope=\"col\">{kind}</th>");
    }
    body.push_str("<th scope=\"col\">Total</th></tr></thead><tbody>");
    for ((_, label), row) in data.labels.iter().zip(&data.rows).rev() {
        let total: i64 = row.values().sum();
        if total == 0 {
            continue;
        }
        let _ = write!(body, "<tr><th scope=\"row\">{}</th>", esc(label));
        for kind in KINDS {
            let _ = write!(body, "<td>{}</td>", usd(row.get(kind).copied().unwrap_or(0)));
        }
        let _ = write!(body, "<td>{}</td></tr>", usd(total));
    }
    body.push_str("</tbody></table></div>");
    Ok(page(&session, "/console/billing", "Billing", &body))
}

pub async fn billing_csv(
    Signed(session): Signed,
    state: web::Data<AppState>,
    query: web::Query<BillingQuery>,
) -> Result<HttpResponse, ApiError> {
    let hourly = query.bucket.as_deref() == Some("hour");
    let data = bucketed(&state, &session.user.id, hourly).await?;
    if query.by.as_deref() == Some("subject") {
        let mut csv = String::from("bucket_start,kind,subject,usd\n");
        for ((at, kind, subject), amount) in &data.detail {
            let _ = writeln!(
                csv,
                "{},{kind},{},{}",
                gantry_billing::history::format_rfc3339(*at),
                csv_cell(subject),
                gantry_billing::credit::usd_string(*amount)
            );
        }
        return Ok(csv_response(
            csv,
            if hourly {
                "hourly-by-subject"
            } else {
                "daily-by-subject"
            },
        ));
    }
    let mut csv = String::from("bucket_start,models_usd,endpoint_workers_usd,pods_usd,storage_usd,total_usd\n");
    for ((at, _), row) in data.labels.iter().zip(&data.rows) {
        let total: i64 = row.values().sum();
        let _ = write!(csv, "{}", gantry_billing::history::format_rfc3339(*at));
        for kind in KINDS {
            let _ = write!(
                csv,
                ",{}",
                gantry_billing::credit::usd_string(row.get(kind).copied().unwrap_or(0))
            );
        }
        let _ = writeln!(csv, ",{}", gantry_billing::credit::usd_string(total));
    }
    Ok(csv_response(csv, if hourly { "hourly" } else { "daily" }))
}

fn csv_response(csv: String, name: &str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/csv; charset=utf-8"))
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"gantry-billing-{name}.csv\""),
        ))
        .body(csv)
}

fn kind_name(kind: &ModelKind) -> &'static str {
    match kind {
        ModelKind::Image => "image",
        ModelKind::Video => "video",
        ModelKind::Speech => "speech",
        ModelKind::Transcription => "speech to text",
        ModelKind::Text => "text",
        ModelKind::Embedding => "embedding",
        ModelKind::Diagnostic => "diagnostic",
        ModelKind::Endpoint => "endpoint",
    }
}

pub async fn playground_index(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut body = String::from("<ul class=\"models\">");
    for spec in state.models.iter() {
        let description = state
            .manifest
            .get(&spec.id)
            .map(|e| e.description.as_str())
            .unwrap_or("");
        let (idle, running) = state.worker_counts(&spec.id).await?;
        let _ = write!(
            body,
            "<li><a href=\"/console/playground/{id}\">{id}</a> <span class=\"tag\">{kind}</span> {avail}<p>{desc}</p>\
             <p class=\"muted\">{price} per {per} {unit}</p></li>",
            id = esc(&spec.id),
            kind = kind_name(&spec.kind),
            avail = if idle + running > 0 {
                "<span class=\"tag ok\">available</span>"
            } else {
                "<span class=\"tag\">no worker</span>"
            },
            desc = esc(description),
            price = esc(&spec.price.usd()),
            per = spec.price.per(),
            unit = esc(&spec.unit),
        );
    }
    body.push_str("</ul>");
    Ok(page(&session, "/console/playground", "Playground", &body))
}

/// One form field made from a property of the model's input schema.
fn field(name: &str, schema: &Value, required: bool) -> String {
    let id = format!("in-{}", esc(name));
    let desc = schema.get("description").and_then(Value::as_str).unwrap_or("");
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => types.first().and_then(Value::as_str).unwrap_or("string"),
        _ if schema.get("enum").is_some() => "enum",
        _ => "string",
    };
    let req = if required { " required" } else { "" };
    let label = format!(
        "<label for=\"{id}\">{}{}</label>",
        esc(name),
        if required {
            " <span aria-hidden=\"true\">*</span>"
        } else {
            ""
        }
    );
    let help = if desc.is_empty() {
        String::new()
    } else {
        format!("<p class=\"help\" id=\"help-{id}\">{}</p>", esc(desc))
    };
    let described = format!(" aria-describedby=\"help-{id} err-{id}\"");
    let err = format!(
        "<p class=\"field-error\" id=\"err-{id}\" data-error-for=\"input.{}\"></p>",
        esc(name)
    );
    let default = schema.get("default");
    let control = if let Some(Value::Array(options)) = schema.get("enum") {
        let mut s = format!(
            "<select id=\"{id}\" name=\"{}\" data-type=\"json\"{described}>",
            esc(name)
        );
        if !required {
            s.push_str("<option value=\"\">(default)</option>");
        }
        for option in options {
            let text = option.as_str().map_or_else(|| option.to_string(), str::to_owned);
            let selected = if default == Some(option) { " selected" } else { "" };
            let _ = write!(
                s,
                "<option value=\"{}\"{selected}>{}</option>",
                esc(&option.to_string()),
                esc(&text)
            );
        }
        s.push_str("</select>");
        s
    } else {
        match ty {
            "integer" | "number" => {
                let mut attrs = String::new();
                for (key, attr) in [("minimum", "min"), ("maximum", "max")] {
                    if let Some(v) = schema.get(key) {
                        let _ = write!(attrs, " {attr}=\"{v}\"");
                    }
                }
                let step = if ty == "integer" { "1" } else { "any" };
                let placeholder = default
                    .map(|d| format!(" placeholder=\"{}\"", esc(&d.to_string())))
                    .unwrap_or_default();
                format!(
                    "<input id=\"{id}\" name=\"{}\" type=\"number\" step=\"{step}\" data-type=\"number\"{attrs}{placeholder}{req}{described}>",
                    esc(name)
                )
            }
            "boolean" => {
                // A checkbox sits in its label, on one line.
                return format!(
                    "<div class=\"field\"><label class=\"check\"><input id=\"{id}\" name=\"{n}\" type=\"checkbox\" \
                     data-type=\"bool\"{described}> {n}</label>{help}{err}</div>",
                    n = esc(name)
                );
            }
            "string" if name == "audio" => format!(
                "<input id=\"{id}\" name=\"{}\" type=\"file\" accept=\"audio/*\" data-type=\"base64\"{described}>\
                 <button type=\"button\" data-record=\"{id}\">Record from the microphone</button>",
                esc(name)
            ),
            "string" => {
                let long =
                    name.contains("prompt") || schema.get("maxLength").and_then(Value::as_u64).unwrap_or(10_000) > 200;
                if long {
                    format!(
                        "<textarea id=\"{id}\" name=\"{}\" rows=\"3\"{req}{described}></textarea>",
                        esc(name)
                    )
                } else {
                    format!("<input id=\"{id}\" name=\"{}\"{req}{described}>", esc(name))
                }
            }
            "array" if schema.pointer("/items/type").and_then(Value::as_str) == Some("string") => format!(
                "<textarea id=\"{id}\" name=\"{}\" rows=\"3\" data-type=\"lines\"{req}{described}></textarea>\
                 <p class=\"help\">One per line.</p>",
                esc(name)
            ),
            _ => format!(
                "<textarea id=\"{id}\" name=\"{}\" rows=\"3\" data-type=\"json\"{req}{described}></textarea>\
                 <p class=\"help\">JSON.</p>",
                esc(name)
            ),
        }
    };
    format!("<div class=\"field\">{label}{control}{help}{err}</div>")
}

pub async fn playground(
    Signed(session): Signed,
    state: web::Data<AppState>,
    model: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let Some(spec) = state.models.iter().find(|m| m.id == *model) else {
        return Err(ApiError::NotFound(format!("no model '{model}'")));
    };
    let entry = state.manifest.get(&spec.id);
    let schema = entry.map(|e| e.input_schema.clone()).unwrap_or(Value::Null);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // Fields one of which is required (`oneOf: [{required: [a]}, {required: [b]}]`).
    let one_of: Vec<&str> = ["oneOf", "anyOf"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(|branch| branch.get("required").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let is_text = matches!(spec.kind, ModelKind::Text);
    let id = esc(&spec.id);
    let mut body = String::with_capacity(8192);
    let _ = write!(
        body,
        "<p>{}</p><p class=\"muted\">{} per {} {} · <a href=\"/console/playground\">all models</a></p>",
        esc(entry.map(|e| e.description.as_str()).unwrap_or("")),
        esc(&spec.price.usd()),
        spec.price.per(),
        esc(&spec.unit)
    );
    let _ = write!(
        body,
        "<form id=\"playground\" class=\"stack\" data-model=\"{id}\" data-kind=\"{}\" novalidate>",
        kind_name(&spec.kind)
    );
    if is_text {
        body.push_str(
            "<div id=\"chat\" class=\"chat\" aria-live=\"polite\"></div>\
             <div class=\"field\"><label for=\"in-message\">Message</label>\
             <textarea id=\"in-message\" name=\"message\" rows=\"3\" required data-chat=\"1\"></textarea></div>",
        );
    }
    let mut advanced = String::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            if is_text && (name == "messages" || name == "prompt") {
                continue;
            }
            // What a model mainly takes shows at once; the rest waits under "More settings".
            let is_main = required.contains(&name.as_str())
                || one_of.contains(&name.as_str())
                || name == "prompt"
                || name.contains("audio")
                || name.contains("image");
            let html = field(name, property, required.contains(&name.as_str()));
            if is_main {
                body.push_str(&html)
            } else {
                advanced.push_str(&html)
            }
        }
    }
    if !advanced.is_empty() {
        let _ = write!(body, "<details><summary>More settings</summary>{advanced}</details>");
    }
    body.push_str(
        "<p class=\"error\" role=\"alert\" data-error-for=\"\"></p><button type=\"submit\">Run</button> \
         <button type=\"button\" id=\"cancel\" hidden>Cancel</button></form>\
         <section aria-labelledby=\"result-h\"><h2 id=\"result-h\">Result</h2>\
         <p id=\"job-status\" role=\"status\" aria-live=\"polite\" class=\"muted\">Nothing run yet.</p>\
         <div id=\"stream\" class=\"stream\" aria-live=\"polite\"></div><div id=\"media\"></div>\
         <details><summary>Output JSON</summary><pre id=\"output\"></pre></details></section>\
         <section aria-labelledby=\"code-h\"><h2 id=\"code-h\">The same call in code</h2>\
         <p class=\"muted\">Use an API key from <a href=\"/console/keys\">API keys</a> in place of <code>$GANTRY_API_KEY</code>.</p>",
    );
    let public = state.public_origin();
    let _ = write!(
        body,
        "<h3>curl</h3><pre><code id=\"code-curl\" data-origin=\"{origin}\"></code></pre>\
         <h3>Python (runpod)</h3><pre><code id=\"code-runpod\"></code></pre>",
        origin = esc(&public)
    );
    // Text and embedding models are also served on the OpenAI routes.
    if is_text || matches!(spec.kind, ModelKind::Embedding) {
        body.push_str("<h3>Python (OpenAI SDK)</h3><pre><code id=\"code-openai\"></code></pre>");
    }
    body.push_str("</section>");
    Ok(page(&session, "/console/playground", &spec.id, &body))
}

pub async fn jobs(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let rows = state.jobs.recent(&session.user.id, 100, false).await?;
    let body = format!(
        "<p class=\"muted\">Your latest jobs (up to 100) kept within the retention period.</p>{}",
        jobs_table(&rows, "No jobs yet.")
    );
    Ok(page(&session, "/console/jobs", "Jobs", &body))
}

fn pretty(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| text.to_owned())
}

pub async fn job(
    Signed(session): Signed,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (model, job_id) = path.into_inner();
    let view = state.jobs.get(&session.user.id, &model, &job_id).await?;
    let row = state.jobs.row(&session.user.id, &job_id).await?;
    let mut body = String::with_capacity(8192);
    let status = serde_json::to_value(view.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let _ = write!(
        body,
        "<dl class=\"facts\"><dt>Job</dt><dd><code>{}</code></dd><dt>Model</dt><dd>{}</dd><dt>Status</dt><dd id=\"job-state\">{}</dd>\
         <dt>Waited</dt><dd>{}</dd><dt>Ran</dt><dd>{}</dd>",
        esc(&view.id),
        esc(&model),
        status_badge(&status),
        html::duration(view.delay_time_ms as i64),
        html::duration(view.execution_time_ms as i64),
    );
    if let Some(row) = &row {
        let _ = write!(
            body,
            "<dt>Submitted</dt><dd>{}</dd><dt>Cost</dt><dd>{}</dd>",
            html::time(row.created_at_ms),
            row.cost_micro_usd.map_or_else(|| "–".into(), usd)
        );
    }
    body.push_str("</dl>");
    if let Some(error) = &view.error {
        let _ = write!(body, "<h2>Error</h2><p class=\"error\">{}</p>", esc(error));
    }
    if let Some(row) = &row {
        let _ = write!(body, "<h2>Input</h2><pre>{}</pre>", esc(&pretty(&row.input)));
    }
    if let Some(output) = &view.output {
        let text = serde_json::to_string_pretty(output).unwrap_or_default();
        let _ = write!(
            body,
            "<h2>Output</h2><div id=\"media\" data-output=\"{}\"></div><pre id=\"output\">{}</pre>",
            esc(&output.to_string()),
            esc(&text)
        );
    }
    if matches!(status.as_str(), "IN_QUEUE" | "IN_PROGRESS") {
        let _ = write!(
            body,
            "<h2>Stream</h2><div id=\"stream\" class=\"stream\" aria-live=\"polite\" data-follow=\"/console/api/models/v2/{}/stream/{}\"></div>",
            esc(&model),
            esc(&view.id)
        );
    }
    Ok(page(&session, "/console/jobs", "Job", &body))
}

pub async fn endpoints(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let list = state
        .containers
        .list_endpoints(&session.user.id)
        .await
        .map_err(|e| ApiError::internal("console endpoints", &e))?;
    let mut body = String::from(
        "<p class=\"muted\">Your own containers run as serverless endpoints. Create and change them with \
         <code>POST /v2/serverless</code> (see the docs); their jobs run at <code>/v2/&lt;endpoint id&gt;/run</code>.</p>",
    );
    if list.is_empty() {
        body.push_str("<p class=\"muted\">No endpoints.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">Id</th><th scope=\"col\">Name</th><th scope=\"col\">Image</th>\
             <th scope=\"col\">Workers (scaling)</th><th scope=\"col\">Version</th></tr></thead><tbody>",
        );
        for e in &list {
            let id = esc(&e.id);
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/endpoints/{id}\"><code>{id}</code></a></td><td>{}</td><td><code>{}</code></td><td>\
                 <form class=\"inline\" data-api=\"/console/api/manage/v2/serverless/{id}\" data-method=\"PATCH\" novalidate>\
                 <label for=\"min-{id}\">Min</label><input id=\"min-{id}\" name=\"workers.min\" type=\"number\" min=\"0\" data-type=\"number\" value=\"{}\">\
                 <label for=\"max-{id}\">Max</label><input id=\"max-{id}\" name=\"workers.max\" type=\"number\" min=\"0\" data-type=\"number\" value=\"{}\">\
                 <button type=\"submit\">Scale <span class=\"sr\">{}</span></button>\
                 <p class=\"field-error\" data-error-for=\"workers\"></p><p class=\"error\" role=\"alert\" data-error-for=\"\"></p></form>\
                 </td><td>{}</td></tr>",
                esc(&e.spec.name),
                esc(&e.spec.container.image),
                e.spec.workers.min,
                e.spec.workers.max,
                esc(&e.spec.name),
                e.version
            );
        }
        body.push_str("</tbody></table></div>");
    }
    Ok(page(&session, "/console/endpoints", "Serverless endpoints", &body))
}

pub async fn pods(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let list = state
        .containers
        .list_pods(&session.user.id)
        .await
        .map_err(|e| ApiError::internal("console pods", &e))?;
    let mut body = String::from(
        "<p class=\"muted\">Pods are your containers kept running, billed by the second while they run \
         (<code>POST /v2/pods</code>).</p>",
    );
    if list.is_empty() {
        body.push_str("<p class=\"muted\">No pods.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">Id</th><th scope=\"col\">Name</th><th scope=\"col\">Image</th>\
             <th scope=\"col\">Status</th><th scope=\"col\">Per hour</th><th scope=\"col\">Actions</th></tr></thead><tbody>",
        );
        for p in &list {
            let id = esc(&p.id);
            let action = |name: &str, label: &str| {
                format!(
                    "<button type=\"button\" data-api=\"/console/api/manage/v2/pods/{id}/action\" data-method=\"POST\" \
                     data-body='{{\"action\":\"{name}\"}}'>{label} <span class=\"sr\">{pname}</span></button>",
                    pname = esc(&p.name)
                )
            };
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/pods/{id}\"><code>{id}</code></a></td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}{}</td></tr>",
                esc(&p.name),
                esc(&p.spec.container.image),
                status_badge(p.status.as_str()),
                usd(p.hourly_micro_usd),
                action("start", "Start"),
                action("stop", "Stop"),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    Ok(page(&session, "/console/pods", "Pods", &body))
}

pub async fn templates(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let owner = &session.user.id;
    let templates = state.containers.list_templates(owner).await?;
    let registries = state.containers.list_registries(owner).await?;
    let mut body = String::from(
        "<p class=\"muted\">Templates hold an image and its settings; make them with <code>POST /v2/templates</code>. \
         Start an endpoint or a pod from one here.</p>",
    );
    if templates.is_empty() {
        body.push_str("<p class=\"muted\">No templates.</p>");
    }
    for t in &templates {
        let id = esc(&t.id);
        let _ = write!(
            body,
            "<article class=\"row\" aria-label=\"Template {name}\"><h3>{name} <code>{id}</code></h3><p><code>{image}</code> · for {kind}</p>",
            name = esc(&t.name),
            image = esc(&t.container.image),
            kind = if t.serverless { "serverless endpoints" } else { "pods" },
        );
        if t.serverless {
            let _ = write!(
                body,
                "<form class=\"inline\" data-api=\"/console/api/manage/v2/serverless\" data-method=\"POST\" data-then=\"/console/endpoints\" novalidate>\
                 <input type=\"hidden\" name=\"templateId\" value=\"{id}\"><input type=\"hidden\" name=\"type\" value=\"QUEUE\">\
                 <input type=\"hidden\" name=\"scaling.type\" value=\"REQUEST_COUNT\">\
                 <input type=\"hidden\" name=\"scaling.requestCount\" value=\"1\" data-type=\"number\">\
                 <label for=\"ep-name-{id}\">Endpoint name</label><input id=\"ep-name-{id}\" name=\"name\" required>\
                 <label for=\"ep-min-{id}\">Min workers</label><input id=\"ep-min-{id}\" name=\"workers.min\" type=\"number\" min=\"0\" value=\"0\" data-type=\"number\">\
                 <label for=\"ep-max-{id}\">Max workers</label><input id=\"ep-max-{id}\" name=\"workers.max\" type=\"number\" min=\"0\" value=\"1\" data-type=\"number\">\
                 <button type=\"submit\">Create endpoint</button>\
                 <p class=\"field-error\" data-error-for=\"name\"></p><p class=\"field-error\" data-error-for=\"workers\"></p>\
                 <p class=\"error\" role=\"alert\" data-error-for=\"\"></p></form>"
            );
        } else {
            let mut flavors = String::new();
            for cpu in state.cpus.iter() {
                let _ = write!(
                    flavors,
                    "<option value=\"{}\">{}</option>",
                    esc(&cpu.id),
                    esc(&cpu.name)
                );
            }
            let _ = write!(
                body,
                "<form class=\"inline\" data-api=\"/console/api/manage/v2/pods\" data-method=\"POST\" data-then=\"/console/pods\" novalidate>\
                 <input type=\"hidden\" name=\"templateId\" value=\"{id}\">\
                 <label for=\"pod-name-{id}\">Pod name</label><input id=\"pod-name-{id}\" name=\"name\" required>\
                 <label for=\"pod-cpu-{id}\">CPU</label><select id=\"pod-cpu-{id}\" name=\"cpu.id\">{flavors}</select>\
                 <label for=\"pod-vcpu-{id}\">vCPUs</label><input id=\"pod-vcpu-{id}\" name=\"cpu.vcpuCount\" type=\"number\" min=\"1\" value=\"2\" data-type=\"number\">\
                 <button type=\"submit\">Create pod</button>\
                 <p class=\"field-error\" data-error-for=\"name\"></p><p class=\"field-error\" data-error-for=\"cpu\"></p>\
                 <p class=\"error\" role=\"alert\" data-error-for=\"\"></p></form>"
            );
        }
        body.push_str("</article>");
    }
    body.push_str("<h2>Registry credentials</h2>");
    if registries.is_empty() {
        body.push_str("<p class=\"muted\">None. Add them with <code>POST /v2/registries</code>; only their names are ever shown.</p>");
    } else {
        body.push_str("<ul>");
        for r in &registries {
            let _ = write!(
                body,
                "<li>{} <code>{}</code> <button type=\"button\" class=\"danger\" data-api=\"/console/api/manage/v2/registries/{id}\" \
                 data-method=\"DELETE\" data-confirm=\"Delete these registry credentials?\">Delete <span class=\"sr\">{name}</span></button></li>",
                esc(&r.name),
                esc(&r.id),
                id = esc(&r.id),
                name = esc(&r.name)
            );
        }
        body.push_str("</ul>");
    }
    Ok(page(&session, "/console/templates", "Templates", &body))
}

pub async fn endpoint(
    Signed(session): Signed,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let endpoint = state.containers.get_endpoint(&session.user.id, &id).await?;
    let workers = match &state.fleet {
        Some(fleet) => fleet.worker_views(&endpoint.id).await?,
        None => Vec::new(),
    };
    let id = esc(&endpoint.id);
    let mut body = String::with_capacity(4096);
    let _ = write!(
        body,
        "<dl class=\"facts\"><dt>Endpoint</dt><dd><code>{id}</code></dd><dt>Image</dt><dd><code>{}</code></dd>\
         <dt>Version</dt><dd>{}</dd><dt>Workers</dt><dd>{} to {}</dd><dt>Jobs</dt><dd><code>{}/v2/{id}/run</code>, \
         <code>/runsync</code>, <code>/status/&lt;job&gt;</code></dd></dl>\
         <p><a href=\"/console/playground/{id}\">Send it a job in the playground</a></p><h2>Workers</h2>",
        esc(&endpoint.spec.container.image),
        endpoint.version,
        endpoint.spec.workers.min,
        endpoint.spec.workers.max,
        esc(&state.public_origin()),
    );
    if workers.is_empty() {
        body.push_str("<p class=\"muted\">No workers now: they start with the queue, up to the maximum.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr>\
             <th scope=\"col\">Worker</th><th scope=\"col\">Status</th><th scope=\"col\">Version</th>\
             <th scope=\"col\">Started</th><th scope=\"col\">Log</th></tr></thead><tbody>",
        );
        for w in &workers {
            let _ = write!(
                body,
                "<tr><td><code>{wid}</code></td><td>{}{}</td><td>{}</td><td>{}</td>\
                 <td><a href=\"/console/endpoints/{id}/workers/{wid}\">Log <span class=\"sr\">of {wid}</span></a></td></tr>",
                status_badge(w.status),
                w.reason
                    .as_deref()
                    .map(|r| format!(" ({})", esc(r)))
                    .unwrap_or_default(),
                w.version,
                html::time(w.started_at_ms),
                wid = esc(&w.id),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    Ok(page(&session, "/console/endpoints", &endpoint.spec.name, &body))
}

pub async fn worker(
    Signed(session): Signed,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (endpoint, worker) = path.into_inner();
    let endpoint = state.containers.get_endpoint(&session.user.id, &endpoint).await?;
    let (id, wid) = (esc(&endpoint.id), esc(&worker));
    let body = format!(
        "<p><a href=\"/console/endpoints/{id}\">Back to {}</a></p><p class=\"muted\" id=\"log-state\">Following the worker's log.</p>\
         <pre id=\"logs\" class=\"logs\" tabindex=\"0\" aria-label=\"Worker log\" aria-live=\"polite\" \
         data-logs=\"/console/api/manage/v2/serverless/{id}/workers/{wid}/logs?follow=true&amp;tail=500\"></pre>",
        esc(&endpoint.spec.name)
    );
    Ok(page(&session, "/console/endpoints", &format!("Worker {worker}"), &body))
}

pub async fn pod(
    Signed(session): Signed,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let pod = state.containers.get_pod(&session.user.id, &id).await?;
    let id = esc(&pod.id);
    let mut body = String::with_capacity(4096);
    let _ = write!(
        body,
        "<dl class=\"facts\"><dt>Pod</dt><dd><code>{id}</code></dd><dt>Name</dt><dd>{}</dd><dt>Image</dt><dd><code>{}</code></dd>\
         <dt>Status</dt><dd>{}{}</dd><dt>Per hour</dt><dd>{}</dd><dt>Created</dt><dd>{}</dd></dl><p>",
        esc(&pod.name),
        esc(&pod.spec.container.image),
        status_badge(pod.status.as_str()),
        pod.reason
            .as_deref()
            .map(|r| format!(" ({})", esc(r)))
            .unwrap_or_default(),
        usd(pod.hourly_micro_usd),
        html::time(pod.created_at_ms),
    );
    for (action, label) in [("start", "Start"), ("stop", "Stop"), ("restart", "Restart")] {
        let _ = write!(
            body,
            "<button type=\"button\" data-api=\"/console/api/manage/v2/pods/{id}/action\" data-method=\"POST\" \
             data-body='{{\"action\":\"{action}\"}}'>{label}</button> "
        );
    }
    let _ = write!(
        body,
        "<button type=\"button\" class=\"danger\" data-api=\"/console/api/manage/v2/pods/{id}\" data-method=\"DELETE\" \
         data-confirm=\"Terminate this pod? Its container disk is lost.\" data-then=\"/console/pods\">Terminate</button></p>\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p>\
         <h2>Logs</h2><p class=\"muted\" id=\"log-state\">Following the pod's log as it is written.</p>\
         <pre id=\"logs\" class=\"logs\" tabindex=\"0\" aria-label=\"Pod log\" aria-live=\"polite\" data-logs=\"/console/api/manage/v2/pods/{id}/logs?follow=true&amp;tail=500\"></pre>"
    );
    Ok(page(&session, "/console/pods", &pod.name, &body))
}

pub async fn admin(Signed(session): Signed, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if session.user.role != Role::Admin {
        return Err(ApiError::Forbidden("the operator pages need the admin role".into()));
    }
    let users = state
        .auth
        .list_users()
        .await
        .map_err(|e| ApiError::internal("console users", &e))?;
    let mut body = String::with_capacity(8192);
    body.push_str("<h2>Workers and queues</h2><div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">Model</th>\
         <th scope=\"col\">Idle workers</th><th scope=\"col\">Running workers</th><th scope=\"col\">Queued jobs</th></tr></thead><tbody>");
    let census = state.census.kept_jobs().await?;
    let queued_of = |model: &str| -> i64 {
        census
            .iter()
            .filter(|(m, status, _, _)| m == model && status == "IN_QUEUE")
            .map(|(_, _, n, _)| *n)
            .sum()
    };
    for spec in state.models.iter() {
        let (idle, running) = state.worker_counts(&spec.id).await?;
        let queued = queued_of(&spec.id);
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{idle}</td><td>{running}</td><td>{queued}</td></tr>",
            esc(&spec.id)
        );
    }
    body.push_str("</tbody></table></div><h2>Users</h2><div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"Scrollable table\"><table><thead><tr><th scope=\"col\">Email</th>\
         <th scope=\"col\">Role</th><th scope=\"col\">Console</th><th scope=\"col\">Balance</th><th scope=\"col\">Limits (minute/hour/day)</th></tr></thead><tbody>");
    for user in &users {
        let (balance, _) = state.census.credit(&user.id).await?;
        let show = |v: Option<u64>| v.map_or_else(|| "default".to_owned(), |n| n.to_string());
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&user.email),
            user.role.as_str(),
            if user.has_password {
                "can sign in"
            } else {
                "no password"
            },
            usd(balance),
            if user.limits.exempt {
                "exempt".to_owned()
            } else {
                format!(
                    "{}/{}/{}",
                    show(user.limits.minute),
                    show(user.limits.hour),
                    show(user.limits.day)
                )
            }
        );
    }
    body.push_str(
        "</tbody></table></div><section aria-labelledby=\"topup-h\"><h2 id=\"topup-h\">Add credit</h2>\
         <form class=\"stack\" data-api=\"/console/api/admin/credit\" data-method=\"POST\" novalidate>\
         <label for=\"tu-email\">Email</label><input id=\"tu-email\" name=\"email\" type=\"email\" required>\
         <p class=\"field-error\" data-error-for=\"email\"></p>\
         <label for=\"tu-usd\">USD</label><input id=\"tu-usd\" name=\"usd\" inputmode=\"decimal\" required>\
         <p class=\"field-error\" data-error-for=\"usd\"></p>\
         <label for=\"tu-reason\">Reason</label><input id=\"tu-reason\" name=\"reason\" value=\"top-up\">\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p><button type=\"submit\">Add credit</button></form></section>\
         <section aria-labelledby=\"limits-h\"><h2 id=\"limits-h\">Rate limits</h2>\
         <form class=\"stack\" data-api=\"/console/api/admin/limits\" data-method=\"POST\" novalidate>\
         <label for=\"rl-email\">Email</label><input id=\"rl-email\" name=\"email\" type=\"email\" required>\
         <p class=\"field-error\" data-error-for=\"email\"></p>\
         <label for=\"rl-minute\">Per minute</label><input id=\"rl-minute\" name=\"minute\" type=\"number\" min=\"0\" data-type=\"number\" placeholder=\"default\">\
         <label for=\"rl-hour\">Per hour</label><input id=\"rl-hour\" name=\"hour\" type=\"number\" min=\"0\" data-type=\"number\" placeholder=\"default\">\
         <label for=\"rl-day\">Per day</label><input id=\"rl-day\" name=\"day\" type=\"number\" min=\"0\" data-type=\"number\" placeholder=\"default\">\
         <label class=\"check\"><input type=\"checkbox\" name=\"exempt\" data-type=\"bool\"> Exempt from rate limits</label>\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p><button type=\"submit\">Set limits</button></form></section>\
         <section aria-labelledby=\"role-h\"><h2 id=\"role-h\">Role</h2>\
         <form class=\"stack\" data-api=\"/console/api/admin/role\" data-method=\"POST\" novalidate>\
         <label for=\"ro-email\">Email</label><input id=\"ro-email\" name=\"email\" type=\"email\" required>\
         <p class=\"field-error\" data-error-for=\"email\"></p>\
         <label for=\"ro-role\">Role</label><select id=\"ro-role\" name=\"role\"><option>user</option><option>admin</option></select>\
         <p class=\"error\" role=\"alert\" data-error-for=\"\"></p><button type=\"submit\">Set role</button></form></section>",
    );
    Ok(page(&session, "/console/admin", "Operators", &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_cells_are_quoted_and_never_formulas() {
        assert_eq!(csv_cell("gantry-echo"), "gantry-echo");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_cell("=1+1"), "'=1+1");
    }

    #[test]
    fn only_console_paths_are_followed_after_sign_in() {
        assert_eq!(safe_next(Some("/console/keys?x=1")), "/console/keys?x=1");
        for bad in [
            "//evil.example",
            "https://evil.example/console",
            "/console\\..\\x",
            "/elsewhere",
            "/console\n",
        ] {
            assert_eq!(safe_next(Some(bad)), "/console", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/console");
    }
}
