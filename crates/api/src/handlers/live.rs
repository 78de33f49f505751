//! Server-Sent Events for a followed job (`JobStore::follow`): shared by
//! `GET /v2/{model_id}/stream/{job_id}` with `Accept: text/event-stream` and
//! by the OpenAI-compatible streaming routes.
use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use gantry_jobs::Frame;
use tokio::sync::mpsc;

/// A `text/event-stream` response whose body is `frames`, each turned into
/// SSE text by `render` (which may skip a frame by returning nothing) as the
/// response is written. The body ends after the final frame.
pub(crate) fn sse_response(
    frames: mpsc::Receiver<Frame>,
    render: impl FnMut(Frame) -> Option<String> + 'static,
) -> HttpResponse {
    let body = futures_util::stream::unfold((frames, render, false), |(mut frames, mut render, ended)| async move {
        if ended {
            return None;
        }
        loop {
            let frame = frames.recv().await?;
            let last = matches!(frame, Frame::Final(_) | Frame::Failed(_));
            match render(frame) {
                Some(text) => {
                    let item: Result<Bytes, actix_web::Error> = Ok(Bytes::from(text));
                    return Some((item, (frames, render, last)));
                }
                None if last => return None,
                None => {}
            }
        }
    });
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body)
}

/// One SSE event: optional id and event name, then the data line(s).
pub(crate) fn event(id: Option<i64>, name: Option<&str>, data: &str) -> String {
    let mut text = String::with_capacity(data.len() + 32);
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    if let Some(name) = name {
        text.push_str(&format!("event: {name}\n"));
    }
    for line in data.split('\n') {
        text.push_str("data: ");
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    text
}

/// One SSE event with a textual id and one data line.
pub(crate) fn event_with_id(id: &str, data: &str) -> String {
    format!("id: {id}\ndata: {data}\n\n")
}

/// Whether the client asked for Server-Sent Events.
pub(crate) fn wants_sse(req: &actix_web::HttpRequest) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(',')
                .any(|part| part.trim().starts_with("text/event-stream"))
        })
}

/// The position after `Last-Event-ID` (0 without one); an id that is not a
/// sequence number is refused.
pub(crate) fn resume_from(req: &actix_web::HttpRequest) -> Result<i64, String> {
    match req.headers().get("last-event-id") {
        None => Ok(0),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
            .filter(|seq| *seq >= 0)
            .map(|seq| seq + 1)
            .ok_or_else(|| "Last-Event-ID: must be a chunk sequence number (a non-negative integer)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_framed_line_by_line() {
        assert_eq!(
            event(Some(3), Some("chunk"), "{\"a\":1}"),
            "id: 3\nevent: chunk\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(event(None, None, "a\nb"), "data: a\ndata: b\n\n");
    }
}
