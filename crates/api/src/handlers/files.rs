//! `GET /files/jobs/{job_id}/{attempt}/{name}`: generated files of the local
//! file store, by signed URL. The URL is the credential (no API key): its
//! signature covers the key, the media type and the expiry, and is checked
//! in constant time; a tampered or expired URL is `403`. Single byte ranges
//! are honoured (`206`, or `416` past the end) so that audio and video can
//! be seeked. Only the media types of `gantry_files::served_inline` are
//! served as themselves; any other is `application/octet-stream` with
//! `Content-Disposition: attachment`. Every file carries `nosniff` and a
//! `sandbox` content security policy.
use std::collections::HashMap;

use actix_web::http::{Method, StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use gantry_files::{Denied, RangeRequest, ReadError};

use crate::problem::{ApiError, problem_response};
use crate::state::AppState;

#[utoipa::path(get, path = "/files/jobs/{job_id}/{attempt}/{name}", operation_id = "getFile", tag = "Files",
    description = "A generated file (image, audio, video) by the URL a job's output holds. The URL is signed and \
works until it expires (7 days after the file was created, by default); no API key is needed. `Range: bytes=…` \
with one range is honoured.",
    params(
        ("job_id" = String, Path, description = "The job"),
        ("attempt" = u32, Path, description = "The attempt that made the file"),
        ("name" = String, Path, description = "The file"),
        ("type" = String, Query, description = "The file's media type (signed)"),
        ("expires" = i64, Query, description = "Unix time (s) the URL stops working (signed)"),
        ("sig" = String, Query, description = "HMAC-SHA256 of the above, hex"),
        ("Range" = Option<String>, Header, description = "One byte range, e.g. `bytes=0-1023`"),
    ),
    responses(
        (status = 200, description = "The whole file", content_type = "application/octet-stream"),
        (status = 206, description = "The requested range", content_type = "application/octet-stream"),
        (status = 403, description = "The URL is tampered with or has expired", body = crate::problem::Problem,
            content_type = "application/problem+json"),
        (status = 404, description = "No such file (deleted after its lifetime)", body = crate::problem::Problem,
            content_type = "application/problem+json"),
        (status = 416, description = "The range starts past the end", body = crate::problem::Problem,
            content_type = "application/problem+json"),
    ))]
pub async fn get(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let Some(files) = state.files.as_ref() else {
        return Err(ApiError::NotFound("this server stores no files".into()));
    };
    let (job_id, attempt, name) = path.into_inner();
    let key = format!("jobs/{job_id}/{attempt}/{name}");
    let (Some(media_type), Some(expires), Some(sig)) = (query.get("type"), query.get("expires"), query.get("sig"))
    else {
        return Err(ApiError::Forbidden(
            "the URL is not signed: use the URL from the job's output as it is".into(),
        ));
    };
    let expires: i64 = expires
        .parse()
        .map_err(|_| ApiError::Forbidden(Denied::BadSignature.to_string()))?;
    files.verify(&key, media_type, expires, sig).map_err(|denied| {
        ApiError::Forbidden(match denied {
            Denied::BadSignature => "the URL's signature does not match: it was changed".to_owned(),
            Denied::Expired => "the URL has expired (files are kept for a limited time)".to_owned(),
        })
    })?;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(RangeRequest::parse);
    let ranged = match files.read(&key, range).await {
        Ok(ranged) => ranged,
        Err(ReadError::NotFound) => return Err(ApiError::NotFound("no such file".into())),
        Err(ReadError::Unsatisfiable(size)) => {
            let mut response = problem_response(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("the range starts past the end of the file ({size} bytes)"),
                Vec::new(),
            );
            if let Ok(value) = header::HeaderValue::from_str(&format!("bytes */{size}")) {
                response.headers_mut().insert(header::CONTENT_RANGE, value);
            }
            return Ok(response);
        }
        Err(ReadError::Store(error)) => {
            tracing::error!(%key, %error, "reading a stored file failed");
            return Err(ApiError::Unavailable("the file store cannot be read now".into()));
        }
    };
    let partial = range.is_some();
    let mut response = if partial {
        HttpResponse::PartialContent()
    } else {
        HttpResponse::Ok()
    };
    let left = (expires - chrono_now()).max(0);
    if gantry_files::served_inline(media_type) {
        response.insert_header((header::CONTENT_TYPE, media_type.as_str()));
    } else {
        response
            .insert_header((header::CONTENT_TYPE, gantry_dispatch::OCTET_STREAM))
            .insert_header((header::CONTENT_DISPOSITION, "attachment"));
    }
    response
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .insert_header((header::CACHE_CONTROL, format!("private, max-age={left}")))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        // Opened on its own, a file is a sandboxed document: no script, no
        // access to the platform's origin.
        .insert_header((header::CONTENT_SECURITY_POLICY, "sandbox"));
    if partial {
        response.insert_header((
            header::CONTENT_RANGE,
            format!(
                "bytes {}-{}/{}",
                ranged.range.start,
                ranged.range.end.saturating_sub(1),
                ranged.size
            ),
        ));
    }
    let length = ranged.range.end - ranged.range.start;
    if req.method() == Method::HEAD {
        // A sized body that is never polled: HEAD carries its length only.
        let nothing = futures_util::stream::empty::<Result<web::Bytes, actix_web::Error>>();
        return Ok(response.no_chunking(length).streaming(nothing));
    }
    let body = ranged
        .body
        .map(|chunk| chunk.map_err(actix_web::error::ErrorInternalServerError));
    Ok(response.no_chunking(length).streaming(body))
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[utoipa::path(head, path = "/files/jobs/{job_id}/{attempt}/{name}", operation_id = "headFile", tag = "Files",
    description = "The headers `GET` would answer with (`Content-Type`, `Content-Length`, `Accept-Ranges`), no body.",
    params(
        ("job_id" = String, Path, description = "The job"),
        ("attempt" = u32, Path, description = "The attempt that made the file"),
        ("name" = String, Path, description = "The file"),
        ("type" = String, Query, description = "The file's media type (signed)"),
        ("expires" = i64, Query, description = "Unix time (s) the URL stops working (signed)"),
        ("sig" = String, Query, description = "HMAC-SHA256 of the above, hex"),
    ),
    responses(
        (status = 200, description = "The file exists and the URL is valid"),
        (status = 403, description = "The URL is tampered with or has expired"),
        (status = 404, description = "No such file"),
    ))]
pub async fn head(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    get(req, state, path, query).await
}
