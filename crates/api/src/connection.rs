//! The listeners' connections. actix-http answers three errors itself, before
//! any request reaches the application and so past its error handlers: `400`
//! for a request it cannot parse, `408` when no whole request head arrives in
//! time (`http.head_timeout_ms`) and `431` for a request head over its limit
//! (128 KiB, or more than 96 header fields). It writes them with an empty body.
//! [`ProblemIo`] sits between it and the socket and writes those three as
//! problem+json, like every other error of the API.
//!
//! It recognises them by what only they are: a write that holds exactly one
//! response head, with status 400, 408 or 431, `content-length: 0` and no
//! content type. The application's own errors always carry a problem+json
//! body, and a response body that happens to start a write with such bytes
//! would also have to end exactly there, at a blank line.
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::problem::{PROBLEM_JSON, Problem};

/// A connection whose protocol-level error answers are rewritten as problems.
pub struct ProblemIo<T> {
    inner: T,
    /// The problem being written in place of actix-http's empty answer.
    replacing: Option<Replacement>,
}

struct Replacement {
    bytes: Vec<u8>,
    written: usize,
    /// How many bytes of the caller's buffer the replacement stands for.
    covers: usize,
}

impl<T> ProblemIo<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, replacing: None }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let replacement = match &mut this.replacing {
            Some(replacement) => replacement,
            None => match protocol_error(buf) {
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
                Some(bytes) => this.replacing.insert(Replacement {
                    bytes,
                    written: 0,
                    covers: buf.len(),
                }),
            },
        };
        // The caller learns its buffer was written only once all of the
        // replacement is; until then it retries with the same buffer.
        while replacement.written < replacement.bytes.len() {
            match ready!(Pin::new(&mut this.inner).poll_write(cx, &replacement.bytes[replacement.written..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => replacement.written += n,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        let covers = replacement.covers;
        this.replacing = None;
        Poll::Ready(Ok(covers))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The problem+json response to write instead of `buf`, when `buf` is one of
/// actix-http's own bodiless error answers.
fn protocol_error(buf: &[u8]) -> Option<Vec<u8>> {
    // The cheap test first: every response of the application passes here.
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let (status, title, detail) = match rest.get(..4)? {
        b"400 " => (
            400,
            "Bad Request",
            "the request is not well-formed HTTP/1.1 (request line, header fields or chunked body)",
        ),
        b"408 " => (408, "Request Timeout", "the request head did not arrive in time"),
        b"431 " => (
            431,
            "Request Header Fields Too Large",
            "the request line and header fields exceed 128 KiB or 96 fields",
        ),
        _ => return None,
    };
    // Exactly one response head, nothing after it.
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    if end + 4 != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut date = None;
    let mut empty = false;
    for line in head.split("\r\n").skip(1) {
        let (name, value) = line.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-type" => return None,
            "content-length" => empty = value.trim() == "0",
            "date" => date = Some(value.trim()),
            _ => {}
        }
    }
    if !empty {
        return None;
    }
    let body = serde_json::to_vec(&Problem {
        title: title.into(),
        status,
        detail: detail.into(),
        errors: Vec::new(),
    })
    .ok()?;
    let version = &buf[..8];
    let mut out = Vec::with_capacity(160 + body.len());
    out.extend_from_slice(version);
    out.extend_from_slice(format!(" {status} {title}\r\ncontent-type: {PROBLEM_JSON}\r\n").as_bytes());
    out.extend_from_slice(format!("content-length: {}\r\nconnection: close\r\n", body.len()).as_bytes());
    if let Some(date) = date {
        out.extend_from_slice(format!("date: {date}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::protocol_error;

    #[test]
    fn actix_https_own_answers_become_problems() {
        for (head, status) in [
            (
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: Fri, 27 Nov 2026 00:00:00 GMT\r\n\r\n",
                400,
            ),
            (
                "HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 00:00:00 GMT\r\n\r\n",
                408,
            ),
            (
                "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
                431,
            ),
        ] {
            let out = String::from_utf8(protocol_error(head.as_bytes()).expect(head)).unwrap();
            let (head_out, body) = out.split_once("\r\n\r\n").unwrap();
            assert!(head_out.starts_with(&format!("HTTP/1.1 {status} ")), "{out}");
            assert!(head_out.contains("content-type: application/problem+json"), "{out}");
            assert!(head_out.contains(&format!("content-length: {}", body.len())), "{out}");
            let problem: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(problem["status"], status);
            assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
            assert_eq!(problem["errors"], serde_json::json!([]));
        }
    }

    #[test]
    fn everything_else_passes_untouched() {
        for buf in [
            // The application's own problems have a type and a body.
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\ncontent-type: application/problem+json\r\n\r\n{}",
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n",
            // Other statuses, and heads followed by more bytes.
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
            // Body bytes that only look like a head.
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            "hello HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            "",
        ] {
            assert!(protocol_error(buf.as_bytes()).is_none(), "{buf:?}");
        }
    }
}
