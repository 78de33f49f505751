//! Turning the body of `GET /containers/{id}/logs` into lines.
//!
//! The engine sends one of two encodings and, at API 1.41, does not say which in a way every engine
//! agrees on (the `application/vnd.docker.multiplexed-stream` content type only arrived with 1.42):
//!
//! * **multiplexed** (containers without a TTY): frames of an 8-byte header — stream id (0 stdin,
//!   1 stdout, 2 stderr), three zero bytes, a big-endian u32 payload length — then the payload;
//! * **raw** (TTY containers): the terminal's bytes, with no framing and no stdout/stderr split.
//!
//! Because this client always asks for `timestamps=1`, a raw body starts with a timestamp digit,
//! while a multiplexed one starts with a stream id byte of 0, 1 or 2, so the first byte decides.
//!
//! Neither frames nor lines line up with network reads: a read may end inside a frame header, and a
//! line may be split across frames. The decoder therefore keeps the unparsed tail of the body and a
//! partial line per stream, and only emits complete lines (plus any partial ones at the very end).

use std::collections::VecDeque;

use bytes::{Buf, BytesMut};

use crate::RuntimeError;

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    /// Standard output (and all output of a TTY container).
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line of container output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Where it was written.
    pub stream: LogStream,
    /// When the engine received it, unix nanoseconds; 0 if the line carried no readable timestamp.
    pub ts_unix_nanos: i64,
    /// The text without the timestamp and the line ending; invalid UTF-8 is replaced.
    pub line: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Undecided,
    Multiplexed,
    Raw,
}

const HEADER_LEN: usize = 8;

/// An incremental decoder of a logs body; feed it with [`LogDecoder::push`], drain it with
/// [`LogDecoder::pop`], and call [`LogDecoder::finish`] at the end of the body.
#[derive(Debug)]
pub struct LogDecoder {
    mode: Mode,
    /// Body bytes not yet parsed into frames (multiplexed mode only).
    pending: BytesMut,
    /// Partial lines: the bytes after the last newline seen on each stream.
    partial_out: Vec<u8>,
    partial_err: Vec<u8>,
    ready: VecDeque<LogLine>,
}

impl Default for LogDecoder {
    fn default() -> Self {
        LogDecoder::new()
    }
}

impl LogDecoder {
    /// A decoder that detects the encoding from the first byte.
    pub fn new() -> LogDecoder {
        LogDecoder {
            mode: Mode::Undecided,
            pending: BytesMut::new(),
            partial_out: Vec::new(),
            partial_err: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// A decoder told the encoding up front (from the response's content type).
    pub fn with_multiplexed(multiplexed: bool) -> LogDecoder {
        LogDecoder {
            mode: if multiplexed { Mode::Multiplexed } else { Mode::Raw },
            ..LogDecoder::new()
        }
    }

    /// Feeds the next chunk of the body. Fails only on a broken frame header, after which the body
    /// cannot be resynchronised.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), RuntimeError> {
        if chunk.is_empty() {
            return Ok(());
        }
        if self.mode == Mode::Undecided {
            self.mode = if chunk[0] <= 2 { Mode::Multiplexed } else { Mode::Raw };
        }
        match self.mode {
            Mode::Raw => {
                self.take_lines(LogStream::Stdout, chunk);
                Ok(())
            }
            _ => {
                self.pending.extend_from_slice(chunk);
                self.parse_frames()
            }
        }
    }

    /// The next complete line, if any.
    pub fn pop(&mut self) -> Option<LogLine> {
        self.ready.pop_front()
    }

    /// Ends the body: partial lines become lines. A truncated last frame is dropped (the engine
    /// closed the stream mid-frame, e.g. because the container was removed).
    pub fn finish(&mut self) {
        if !self.pending.is_empty() {
            tracing::debug!(
                bytes = self.pending.len(),
                "logs body ended inside a frame; dropping the rest"
            );
            self.pending.clear();
        }
        for stream in [LogStream::Stdout, LogStream::Stderr] {
            let partial = std::mem::take(self.partial_mut(stream));
            if !partial.is_empty() {
                self.ready.push_back(parse_line(stream, &partial));
            }
        }
    }

    fn parse_frames(&mut self) -> Result<(), RuntimeError> {
        while self.pending.len() >= HEADER_LEN {
            let header = &self.pending[..HEADER_LEN];
            if header[1..4] != [0, 0, 0] || header[0] > 2 {
                return Err(RuntimeError::Protocol(format!("bad log frame header {header:02x?}")));
            }
            let stream = if header[0] == 2 {
                LogStream::Stderr
            } else {
                LogStream::Stdout
            };
            let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
            if self.pending.len() < HEADER_LEN + len {
                break;
            }
            self.pending.advance(HEADER_LEN);
            let payload = self.pending.split_to(len);
            self.take_lines(stream, &payload);
        }
        Ok(())
    }

    fn partial_mut(&mut self, stream: LogStream) -> &mut Vec<u8> {
        match stream {
            LogStream::Stdout => &mut self.partial_out,
            LogStream::Stderr => &mut self.partial_err,
        }
    }

    fn take_lines(&mut self, stream: LogStream, mut bytes: &[u8]) {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let partial = self.partial_mut(stream);
            let line = if partial.is_empty() {
                parse_line(stream, &bytes[..nl])
            } else {
                partial.extend_from_slice(&bytes[..nl]);
                let whole = std::mem::take(partial);
                parse_line(stream, &whole)
            };
            self.ready.push_back(line);
            bytes = &bytes[nl + 1..];
        }
        self.partial_mut(stream).extend_from_slice(bytes);
    }
}

/// Splits `<RFC3339Nano timestamp> <text>` (a TTY adds `\r` before the newline).
fn parse_line(stream: LogStream, raw: &[u8]) -> LogLine {
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let text = String::from_utf8_lossy(raw);
    let (ts, line) = match text.split_once(' ') {
        Some((ts, rest)) => match parse_rfc3339_nanos(ts) {
            Some(ns) => (ns, rest.to_owned()),
            None => (0, text.into_owned()),
        },
        // An empty line is just the timestamp.
        None => match parse_rfc3339_nanos(&text) {
            Some(ns) => (ns, String::new()),
            None => (0, text.into_owned()),
        },
    };
    LogLine {
        stream,
        ts_unix_nanos: ts,
        line,
    }
}

/// Parses an RFC 3339 timestamp with optional fraction (any number of digits; beyond nanoseconds
/// they are ignored) and a `Z` or `±HH:MM` offset into unix nanoseconds. Times outside what i64
/// nanoseconds can hold (before 1677 or after 2262, such as Go's zero time that the engine uses for
/// "never") are `None`.
///
/// Hand-written rather than pulling in a date crate: the engine only ever emits this one format
/// (Go's `RFC3339Nano`), and the crate is meant to stay small.
pub fn parse_rfc3339_nanos(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let digits = s.get(from..to)?;
        if !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 9 {
                nanos = nanos * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..9 {
            nanos *= 10;
        }
    }
    let offset_secs = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1, i + 3)?, num(i + 4, i + 6)?);
            let off = oh * 3600 + om * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![stream, 0, 0, 0];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn drain(d: &mut LogDecoder) -> Vec<LogLine> {
        std::iter::from_fn(|| d.pop()).collect()
    }

    const TS: &str = "2024-05-01T10:00:00.123456789Z";
    const TS_NS: i64 = 1_714_557_600_123_456_789;

    #[test]
    fn timestamps_parse_to_unix_nanos() {
        assert_eq!(parse_rfc3339_nanos("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_nanos(TS), Some(TS_NS));
        assert_eq!(
            parse_rfc3339_nanos("2024-05-01T10:00:00Z"),
            Some(1_714_557_600_000_000_000)
        );
        // Go trims trailing zeros from RFC3339Nano fractions.
        assert_eq!(
            parse_rfc3339_nanos("2024-05-01T10:00:00.5Z"),
            Some(1_714_557_600_500_000_000)
        );
        assert_eq!(
            parse_rfc3339_nanos("2024-05-01T12:00:00.000000001+02:00"),
            Some(1_714_557_600_000_000_001)
        );
        assert_eq!(
            parse_rfc3339_nanos("2024-05-01T05:30:00-04:30"),
            Some(1_714_557_600_000_000_000)
        );
        assert_eq!(
            parse_rfc3339_nanos("2000-02-29T00:00:00Z"),
            Some(951_782_400_000_000_000)
        );
        assert_eq!(parse_rfc3339_nanos("1969-12-31T23:59:59Z"), Some(-1_000_000_000));
        // More than nanosecond precision is cut, not rounded.
        assert_eq!(
            parse_rfc3339_nanos("1970-01-01T00:00:00.1234567899Z"),
            Some(123_456_789)
        );
        // Go's zero time, the engine's "never", lies outside what i64 nanoseconds can hold (1677..2262).
        assert_eq!(parse_rfc3339_nanos("0001-01-01T00:00:00Z"), None);
        for bad in [
            "",
            "hello world",
            "2024-05-01",
            "2024-05-01T10:00:00",
            "2024-13-01T10:00:00Z",
            "2024-05-01T10:00:00.Z",
            "2024-05-01T10:00:00Zjunk",
            "2024-05-01T10:00:00+0200",
            "2024-0a-01T10:00:00Z",
        ] {
            assert_eq!(parse_rfc3339_nanos(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn multiplexed_frames_split_at_every_byte_give_the_same_lines() {
        let mut body = frame(1, format!("{TS} out one\n{TS} out two\n").as_bytes());
        body.extend(frame(2, format!("{TS} err one\n").as_bytes()));
        // A line split across two frames, as the engine does for long lines.
        body.extend(frame(1, format!("{TS} spl").as_bytes()));
        body.extend(frame(1, b"it line\n"));
        body.extend(frame(2, format!("{TS} no newline at end").as_bytes()));
        let expected = vec![
            LogLine {
                stream: LogStream::Stdout,
                ts_unix_nanos: TS_NS,
                line: "out one".into(),
            },
            LogLine {
                stream: LogStream::Stdout,
                ts_unix_nanos: TS_NS,
                line: "out two".into(),
            },
            LogLine {
                stream: LogStream::Stderr,
                ts_unix_nanos: TS_NS,
                line: "err one".into(),
            },
            LogLine {
                stream: LogStream::Stdout,
                ts_unix_nanos: TS_NS,
                line: "split line".into(),
            },
            LogLine {
                stream: LogStream::Stderr,
                ts_unix_nanos: TS_NS,
                line: "no newline at end".into(),
            },
        ];
        for chunk_len in 1..=body.len() {
            let mut d = LogDecoder::new();
            let mut got = Vec::new();
            for chunk in body.chunks(chunk_len) {
                d.push(chunk).unwrap();
                got.extend(drain(&mut d));
            }
            d.finish();
            got.extend(drain(&mut d));
            assert_eq!(got, expected, "chunks of {chunk_len}");
        }
    }

    #[test]
    fn lines_are_emitted_as_soon_as_they_are_complete() {
        let mut d = LogDecoder::new();
        d.push(&frame(1, format!("{TS} first\n{TS} sec").as_bytes())).unwrap();
        assert_eq!(drain(&mut d).len(), 1);
        d.push(&frame(1, b"ond\n")).unwrap();
        assert_eq!(
            drain(&mut d).iter().map(|l| l.line.as_str()).collect::<Vec<_>>(),
            ["second"]
        );
    }

    #[test]
    fn tty_output_is_raw_stdout_with_carriage_returns_stripped() {
        let body = format!("{TS} tty line\r\n{TS} \r\n{TS} next\r\n");
        for chunk_len in [1, 7, body.len()] {
            let mut d = LogDecoder::new();
            let mut got = Vec::new();
            for chunk in body.as_bytes().chunks(chunk_len) {
                d.push(chunk).unwrap();
                got.extend(drain(&mut d));
            }
            d.finish();
            got.extend(drain(&mut d));
            let lines: Vec<_> = got
                .iter()
                .map(|l| (l.stream, l.ts_unix_nanos, l.line.as_str()))
                .collect();
            assert_eq!(
                lines,
                [
                    (LogStream::Stdout, TS_NS, "tty line"),
                    (LogStream::Stdout, TS_NS, ""),
                    (LogStream::Stdout, TS_NS, "next")
                ]
            );
        }
    }

    #[test]
    fn lines_without_a_timestamp_are_kept_whole() {
        let mut d = LogDecoder::with_multiplexed(false);
        d.push(b"not a timestamp here\nsolo\n").unwrap();
        let got = drain(&mut d);
        assert_eq!(
            got[0],
            LogLine {
                stream: LogStream::Stdout,
                ts_unix_nanos: 0,
                line: "not a timestamp here".into()
            }
        );
        assert_eq!(got[1].line, "solo");
    }

    #[test]
    fn a_broken_frame_header_is_a_protocol_error_and_a_truncated_frame_is_dropped() {
        let mut d = LogDecoder::with_multiplexed(true);
        assert!(matches!(
            d.push(&[1, 0, 7, 0, 0, 0, 0, 1, b'x']),
            Err(RuntimeError::Protocol(_))
        ));
        let mut d = LogDecoder::new();
        let mut body = frame(1, format!("{TS} whole\n").as_bytes());
        body.extend(&frame(1, b"cut off")[..10]);
        d.push(&body).unwrap();
        d.finish();
        assert_eq!(drain(&mut d).len(), 1);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        let mut d = LogDecoder::new();
        let mut payload = format!("{TS} a").into_bytes();
        payload.extend([0xff, b'\n']);
        d.push(&frame(2, &payload)).unwrap();
        assert_eq!(drain(&mut d)[0].line, "a\u{fffd}");
    }
}
