//! The listeners' connections. actix-http answers three errors itself, before
//! any request reaches the application and so past its error handlers: `400`
//! for a request it cannot parse, `408` when no whole request head arrives in
//! time (`http.head_timeout_ms`) and `431` for a request head over its limit
//! (128 KiB, or more than 96 header fields). It writes them with an empty body.
//! [`ProblemIo`] sits between it and the socket and writes those three as
//! problem+json, like every other error of the API.
//!
//! It rewrites only answers the server itself generated, never bytes of a
//! response body: it follows the framing of every response it passes (each
//! head's `content-length`), so it knows where the next head starts. A write
//! that starts exactly there and holds exactly one head with status 400, 408
//! or 431, `content-length: 0` and no content type is actix-http's own
//! answer; the application's errors always carry a problem+json body. Where
//! the framing stops being known (a chunked or close-delimited body, or any
//! `HEAD` request, whose answer has a length but no body), nothing more on
//! that connection is rewritten: a protocol error there keeps its empty
//! body, and a body is never mistaken for a head.
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::problem::{PROBLEM_JSON, Problem};

/// Most bytes of one response head kept while it is written in pieces.
const MAX_HEAD: usize = 64 * 1024;

/// A connection whose protocol-level error answers are rewritten as problems.
pub struct ProblemIo<T> {
    inner: T,
    /// The problem being written in place of actix-http's empty answer.
    replacing: Option<Replacement>,
    /// Where the bytes written so far leave the response stream.
    framing: Framing,
    /// The last bytes read, to find `HEAD ` split across two reads.
    read_tail: [u8; 4],
}

/// The position in the stream of responses, after the bytes written so far.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Framing {
    /// Inside a response head; the bytes of it written so far (none: at the
    /// boundary where a response starts).
    Head(Vec<u8>),
    /// Inside a body with this many bytes left.
    Body(u64),
    /// Lost: nothing on this connection is rewritten any more.
    Unknown,
}

impl Framing {
    /// Follows `written`, bytes that went out on the connection.
    fn advance(&mut self, mut written: &[u8]) {
        while !written.is_empty() {
            match self {
                Framing::Unknown => return,
                Framing::Body(left) => {
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(written.len());
                    *left -= take as u64;
                    written = &written[take..];
                    if *left == 0 {
                        *self = Framing::Head(Vec::new());
                    }
                }
                Framing::Head(head) => {
                    let before = head.len();
                    head.extend_from_slice(written);
                    let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                        if head.len() > MAX_HEAD {
                            *self = Framing::Unknown;
                        }
                        return;
                    };
                    let used = end + 4 - before;
                    *self = match body_length(&head[..end]) {
                        Some(0) => Framing::Head(Vec::new()),
                        Some(length) => Framing::Body(length),
                        None => Framing::Unknown,
                    };
                    written = &written[used..];
                }
            }
        }
    }

    fn at_response_start(&self) -> bool {
        matches!(self, Framing::Head(head) if head.is_empty())
    }
}

/// The body length a response head announces; `None` where the head does not
/// say (chunked, or delimited by the connection's close) or is not a head.
fn body_length(head: &[u8]) -> Option<u64> {
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Some(0);
    }
    let mut length = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let name = name.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.trim().parse().ok()?);
        }
    }
    length
}

struct Replacement {
    bytes: Vec<u8>,
    written: usize,
    /// How many bytes of the caller's buffer the replacement stands for.
    covers: usize,
}

impl<T> ProblemIo<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            replacing: None,
            framing: Framing::Head(Vec::new()),
            read_tail: [0; 4],
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if !read.is_empty() && this.framing != Framing::Unknown {
            // The answer to a HEAD request announces a length it does not
            // send. A body holding these bytes only stops the rewriting too.
            let mut joined = this.read_tail.to_vec();
            joined.extend_from_slice(read);
            if joined.windows(5).any(|w| w == b"HEAD ") {
                this.framing = Framing::Unknown;
            }
            let tail = &joined[joined.len() - 4..];
            this.read_tail.copy_from_slice(tail);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let replacement = match &mut this.replacing {
            Some(replacement) => replacement,
            None => match this.framing.at_response_start().then(|| protocol_error(buf)).flatten() {
                None => {
                    let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
                    this.framing.advance(&buf[..n]);
                    return Poll::Ready(Ok(n));
                }
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
        // The problem closes the connection.
        this.framing = Framing::Unknown;
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{Framing, ProblemIo, protocol_error};

    const ERROR_HEAD: &str = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";

    /// Writes `writes` one `write_all` each through a `ProblemIo`, after the
    /// peer sent `request`; what reaches the peer.
    async fn through(request: &[u8], writes: &[&[u8]]) -> Vec<u8> {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut io = ProblemIo::new(near);
        far.write_all(request).await.unwrap();
        let mut read = vec![0u8; request.len()];
        io.read_exact(&mut read).await.unwrap();
        for write in writes {
            io.write_all(write).await.unwrap();
        }
        drop(io);
        let mut out = Vec::new();
        far.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_body_that_looks_like_an_error_head_passes_untouched() {
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", ERROR_HEAD.len());
        // Twice on one connection, the body written on its own.
        let writes = [
            head.as_bytes(),
            ERROR_HEAD.as_bytes(),
            head.as_bytes(),
            ERROR_HEAD.as_bytes(),
        ];
        let out = through(b"GET /f HTTP/1.1\r\n\r\n", &writes).await;
        assert_eq!(out, writes.concat());
        // Written in pieces of every size, the framing still holds.
        let whole = writes.concat();
        for size in [1, 3, 7, 50] {
            let pieces: Vec<&[u8]> = whole.chunks(size).collect();
            assert_eq!(through(b"GET /f HTTP/1.1\r\n\r\n", &pieces).await, whole);
        }
    }

    #[tokio::test]
    async fn the_servers_own_error_after_a_framed_response_is_rewritten() {
        let head = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
        let out = through(
            b"GET / HTTP/1.1\r\n\r\n",
            &[head.as_bytes(), b"ok", ERROR_HEAD.as_bytes()],
        )
        .await;
        let out = String::from_utf8(out).unwrap();
        let rest = out.strip_prefix(&format!("{head}ok")).unwrap();
        assert!(rest.contains("content-type: application/problem+json"), "{rest}");
        // The first write on a connection is a response's start too.
        let out = through(b"", &[ERROR_HEAD.as_bytes()]).await;
        assert!(String::from_utf8(out).unwrap().contains("application/problem+json"));
    }

    #[tokio::test]
    async fn after_a_head_request_or_a_chunked_body_nothing_is_rewritten() {
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", ERROR_HEAD.len());
        let writes = [head.as_bytes(), ERROR_HEAD.as_bytes()];
        assert_eq!(through(b"HEAD /f HTTP/1.1\r\n\r\n", &writes).await, writes.concat());
        let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let writes = [chunked.as_bytes(), ERROR_HEAD.as_bytes()];
        assert_eq!(through(b"GET /s HTTP/1.1\r\n\r\n", &writes).await, writes.concat());
    }

    #[test]
    fn framing_follows_lengths_and_bodiless_statuses() {
        let mut framing = Framing::Head(Vec::new());
        framing.advance(b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
        assert!(framing.at_response_start());
        framing.advance(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab");
        assert_eq!(framing, Framing::Body(1));
        framing.advance(b"cHTTP/1.1 100 Continue\r\n\r\n");
        assert!(framing.at_response_start());
        framing.advance(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(framing, Framing::Unknown, "close-delimited");
    }

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
