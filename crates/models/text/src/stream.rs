//! Turns the bytes of generated tokens into streamable text.
//!
//! Two things make this more than string concatenation:
//!
//! * A token may end in the middle of a UTF-8 character (byte-level BPE
//!   splits emoji and CJK characters). Such bytes wait until the character is
//!   complete, so every released piece is valid UTF-8.
//! * Stop strings end generation and are not part of the output. Text that
//!   could be the start of a stop string is held back until it is clear that
//!   it is not, so the released pieces always add up to the final text.

/// What one [`TextStream::push`] released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Text that is now final (may be empty).
    pub piece: String,
    /// A stop string was found: generation must end.
    pub stopped: bool,
}

#[derive(Debug)]
pub struct TextStream {
    stops: Vec<String>,
    /// Length in bytes of the longest stop string.
    longest_stop: usize,
    /// The start of a UTF-8 character whose other bytes have not come yet.
    partial: Vec<u8>,
    /// All decoded text; `text[released..]` is held back.
    text: String,
    released: usize,
    stopped: bool,
}

impl TextStream {
    /// A stream that ends at any of `stops` (which must not be empty strings).
    pub fn new(stops: Vec<String>) -> Self {
        debug_assert!(stops.iter().all(|s| !s.is_empty()));
        let longest_stop = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops,
            longest_stop,
            partial: Vec::new(),
            text: String::new(),
            released: 0,
            stopped: false,
        }
    }

    /// Adds the bytes of the next token.
    pub fn push(&mut self, bytes: &[u8]) -> Released {
        if self.stopped {
            return Released {
                piece: String::new(),
                stopped: true,
            };
        }
        let old_len = self.text.len();
        self.partial.extend_from_slice(bytes);
        self.decode(false);
        if self.cut_at_stop(old_len) {
            return Released {
                piece: self.release(self.text.len()),
                stopped: true,
            };
        }
        let hold = self.hold_back();
        Released {
            piece: self.release(self.text.len() - hold),
            stopped: false,
        }
    }

    /// Ends the stream (end of generation or length limit): an unfinished
    /// character becomes U+FFFD and held-back text is released.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let old_len = self.text.len();
        self.decode(true);
        // A replacement character could complete a (strange) stop string.
        self.stopped = self.cut_at_stop(old_len);
        self.release(self.text.len())
    }

    /// The final text: everything released so far.
    pub fn text(&self) -> &str {
        &self.text[..self.released]
    }

    /// Moves complete characters from `partial` to `text`. Invalid bytes
    /// become U+FFFD; an incomplete character at the end stays in `partial`
    /// unless `at_end`.
    fn decode(&mut self, at_end: bool) {
        loop {
            match std::str::from_utf8(&self.partial) {
                Ok(valid) => {
                    self.text.push_str(valid);
                    self.partial.clear();
                    return;
                }
                Err(error) => {
                    let valid_up_to = error.valid_up_to();
                    let (valid, rest) = self.partial.split_at(valid_up_to);
                    // `valid` was just checked by `from_utf8`.
                    self.text.push_str(&String::from_utf8_lossy(valid));
                    match error.error_len() {
                        Some(bad) => {
                            self.text.push(char::REPLACEMENT_CHARACTER);
                            let consumed = valid_up_to + bad.min(rest.len());
                            self.partial.drain(..consumed);
                        }
                        None => {
                            self.partial.drain(..valid_up_to);
                            if at_end {
                                self.text.push(char::REPLACEMENT_CHARACTER);
                                self.partial.clear();
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Looks for a stop string that ends after `old_len` (earlier text was
    /// checked before). On a match, cuts the text there and returns true.
    fn cut_at_stop(&mut self, old_len: usize) -> bool {
        if self.stops.is_empty() {
            return false;
        }
        let mut start = old_len.saturating_sub(self.longest_stop.saturating_sub(1));
        while !self.text.is_char_boundary(start) {
            start -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|stop| self.text[start..].find(stop.as_str()))
            .min();
        match found {
            Some(at) => {
                self.text.truncate(start + at);
                self.stopped = true;
                true
            }
            None => false,
        }
    }

    /// Length of the longest unreleased suffix of `text` that is the start of
    /// some stop string.
    fn hold_back(&self) -> usize {
        let unreleased = self.text.len() - self.released;
        let most = unreleased.min(self.longest_stop.saturating_sub(1));
        (1..=most)
            .rev()
            .find(|&n| {
                let start = self.text.len() - n;
                self.text.is_char_boundary(start) && self.stops.iter().any(|stop| stop.starts_with(&self.text[start..]))
            })
            .unwrap_or(0)
    }

    fn release(&mut self, up_to: usize) -> String {
        let piece = self.text[self.released..up_to].to_owned();
        self.released = up_to;
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `tokens`, then finishes unless a stop string ended the stream;
    /// checks that the pieces add up to the text.
    fn run(stops: &[&str], tokens: &[&[u8]]) -> (Vec<String>, String, bool) {
        let mut stream = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut pieces = Vec::new();
        let mut stopped = false;
        for token in tokens {
            let released = stream.push(token);
            if !released.piece.is_empty() {
                pieces.push(released.piece);
            }
            if released.stopped {
                stopped = true;
                break;
            }
        }
        if !stopped {
            let last = stream.finish();
            if !last.is_empty() {
                pieces.push(last);
            }
        }
        assert_eq!(pieces.concat(), stream.text());
        (pieces, stream.text().to_owned(), stopped)
    }

    #[test]
    fn plain_text_passes_through() {
        let (pieces, text, stopped) = run(&[], &[b"Hello", b",", b" world"]);
        assert_eq!(pieces, ["Hello", ",", " world"]);
        assert_eq!(text, "Hello, world");
        assert!(!stopped);
    }

    #[test]
    fn split_characters_wait_until_complete() {
        let crab = "🦀".as_bytes(); // 4 bytes
        let (pieces, text, _) = run(&[], &[b"a", &crab[..1], &crab[1..3], &crab[3..], "é".as_bytes()]);
        assert_eq!(pieces, ["a", "🦀", "é"]);
        assert_eq!(text, "a🦀é");
        // a character split across a token that also carries text
        let mut second = crab[2..].to_vec();
        second.extend_from_slice(b"x");
        let (pieces, _, _) = run(&[], &[&crab[..2], &second]);
        assert_eq!(pieces, ["🦀x"]);
    }

    #[test]
    fn invalid_and_unfinished_bytes_become_replacement_characters() {
        let (pieces, text, _) = run(&[], &[b"a\xffb", b"\xe2\x82"]);
        assert_eq!(pieces, ["a\u{fffd}b", "\u{fffd}"]);
        assert_eq!(text, "a\u{fffd}b\u{fffd}");
        // an unfinished character followed by a new start byte
        let (_, text, _) = run(&[], &[b"\xe2\x82", b"\xe2\x82\xac"]);
        assert_eq!(text, "\u{fffd}€");
    }

    #[test]
    fn stop_string_in_one_token() {
        let (pieces, text, stopped) = run(&["END"], &[b"one ", b"twoENDthree", b"never"]);
        assert_eq!(pieces, ["one ", "two"]);
        assert_eq!(text, "one two");
        assert!(stopped);
    }

    #[test]
    fn stop_string_across_tokens_is_held_back() {
        let mut stream = TextStream::new(vec!["\n\nUser:".into()]);
        assert_eq!(stream.push(b"Hi").piece, "Hi");
        assert_eq!(stream.push(b"\n").piece, "");
        assert_eq!(stream.push(b"\nUs").piece, "");
        let last = stream.push(b"er: more");
        assert_eq!(
            last,
            Released {
                piece: String::new(),
                stopped: true
            }
        );
        assert_eq!(stream.text(), "Hi");
    }

    #[test]
    fn false_alarm_is_released() {
        let (pieces, text, stopped) = run(&["END"], &[b"a E", b"N", b"D?"]);
        // "E", "EN" are held; "END?" completes the stop string
        assert_eq!(pieces, ["a "]);
        assert_eq!(text, "a ");
        assert!(stopped);
        let (pieces, text, stopped) = run(&["END"], &[b"a E", b"N", b"x"]);
        assert_eq!(pieces, ["a ", "ENx"]);
        assert_eq!(text, "a ENx");
        assert!(!stopped);
        // held text is released when generation ends without a stop
        let (pieces, text, _) = run(&["END"], &[b"a EN"]);
        assert_eq!(pieces, ["a ", "EN"]);
        assert_eq!(text, "a EN");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (_, text, stopped) = run(&["cd", "b"], &[b"abcd"]);
        assert_eq!(text, "a");
        assert!(stopped);
        let (_, text, _) = run(&["xyz", "yz"], &[b"wx", b"y", b"z"]);
        assert_eq!(text, "w");
    }

    #[test]
    fn stop_at_the_very_start_and_multibyte_stops() {
        let (pieces, text, stopped) = run(&["<"], &[b"<tag>"]);
        assert!(pieces.is_empty());
        assert_eq!(text, "");
        assert!(stopped);
        let euro = "€".as_bytes();
        let (_, text, stopped) = run(&["€!"], &[b"1", &euro[..1], &euro[1..], b"!"]);
        assert_eq!(text, "1");
        assert!(stopped);
        let (_, text, stopped) = run(&["€!"], &[b"1", euro, b"?"]);
        assert_eq!(text, "1€?");
        assert!(!stopped);
    }

    #[test]
    fn overlapping_prefixes() {
        // "aab" after "aaa": the held suffix must be the longest candidate
        let (_, text, stopped) = run(&["aab"], &[b"a", b"a", b"a", b"b"]);
        assert_eq!(text, "a");
        assert!(stopped);
    }
}
