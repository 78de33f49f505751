//! Splitting text into the sentences that are synthesised (and streamed) one
//! at a time.

/// Longest piece synthesised at once, in characters: a longer sentence is cut
/// at its last comma, semicolon, colon or dash before this, else at a space,
/// so one chunk never waits on a very long run of text.
pub const MAX_SENTENCE_CHARS: usize = 400;

/// Abbreviations (lowercase, without the period) after which a period does
/// not end a sentence.
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "approx", "dept", "est", "fig",
    "inc", "ltd", "co", "corp", "mt", "gen", "col", "lt", "sgt", "capt", "rev", "hon", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];

/// The sentences of `text`, trimmed, in order, none empty.
///
/// A sentence ends at `.`, `!`, `?` or `…` (with any closing quotes or
/// brackets after it) followed by whitespace or the end of the text, and at
/// a line break that ends a paragraph (a blank line). A period after a
/// common abbreviation ("Dr.", "e.g.") or a single capital letter (an
/// initial) does not end one; nor does one inside a number ("3.14") or a
/// name ("example.com"), as no space follows it. Sentences longer than
/// [`MAX_SENTENCE_CHARS`] are cut further (see there).
pub fn split(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut sentences = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let mut end = None;
        if matches!(c, '.' | '!' | '?' | '…') {
            // Take a run of terminators and closing marks: "?!", ".\"", "...)".
            let mut j = i + 1;
            while j < chars.len() && (matches!(chars[j], '.' | '!' | '?' | '…') || is_closing(chars[j])) {
                j += 1;
            }
            let at_break = j == chars.len() || chars[j].is_whitespace();
            if at_break && !(c == '.' && j == i + 1 && is_abbreviation(&chars[start..i])) {
                end = Some(j);
            }
            i = j.max(i + 1);
        } else if c == '\n' {
            // A blank line (only whitespace between two line breaks) ends a paragraph.
            let mut j = i + 1;
            while j < chars.len() && chars[j].is_whitespace() && chars[j] != '\n' {
                j += 1;
            }
            if j < chars.len() && chars[j] == '\n' {
                end = Some(i);
            }
            i += 1;
        } else {
            i += 1;
        }
        if let Some(end) = end {
            push_sentence(&mut sentences, &chars[start..end]);
            start = end;
        }
    }
    push_sentence(&mut sentences, &chars[start..]);
    sentences
}

fn is_closing(c: char) -> bool {
    matches!(c, '"' | '\'' | '”' | '’' | ')' | ']' | '}' | '»')
}

/// Whether the word before a period is an abbreviation or an initial.
fn is_abbreviation(before: &[char]) -> bool {
    let word: String = before
        .iter()
        .rev()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '(' | '"' | '“' | '\''))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let mut letters = word.chars();
    if let (Some(first), None) = (letters.next(), letters.next()) {
        return first.is_uppercase();
    }
    let lower = word.to_lowercase();
    ABBREVIATIONS.contains(&lower.as_str())
}

/// Adds a sentence (whitespace collapsed), cutting it first if it is too long.
fn push_sentence(sentences: &mut Vec<String>, chars: &[char]) {
    let text: String = chars.iter().collect();
    let mut rest: Vec<char> = text.split_whitespace().collect::<Vec<_>>().join(" ").chars().collect();
    while rest.len() > MAX_SENTENCE_CHARS {
        let window = &rest[..MAX_SENTENCE_CHARS];
        let cut = window
            .iter()
            .rposition(|c| matches!(c, ',' | ';' | ':' | '—' | '–'))
            .map(|p| p + 1)
            .filter(|&p| p > MAX_SENTENCE_CHARS / 4)
            .or_else(|| window.iter().rposition(|c| *c == ' ').filter(|&p| p > 0))
            .unwrap_or(MAX_SENTENCE_CHARS);
        let head: String = rest[..cut].iter().collect::<String>().trim().to_owned();
        if !head.is_empty() {
            sentences.push(head);
        }
        rest = rest[cut..].iter().collect::<String>().trim_start().chars().collect();
    }
    let tail: String = rest.into_iter().collect();
    if !tail.trim().is_empty() {
        sentences.push(tail.trim().to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_terminators_followed_by_space() {
        assert_eq!(
            split("Hello there. How are you? I am fine!  Thanks"),
            ["Hello there.", "How are you?", "I am fine!", "Thanks"]
        );
        assert_eq!(split("One.Two"), ["One.Two"]);
        assert_eq!(split("Pi is 3.14 today."), ["Pi is 3.14 today."]);
    }

    #[test]
    fn keeps_closing_quotes_and_runs_of_marks_with_their_sentence() {
        assert_eq!(
            split("He said \"stop!\" Then he left... Really?! Yes."),
            ["He said \"stop!\"", "Then he left...", "Really?!", "Yes."]
        );
        assert_eq!(split("(An aside.) Next."), ["(An aside.)", "Next."]);
    }

    #[test]
    fn abbreviations_and_initials_do_not_end_sentences() {
        assert_eq!(
            split("Dr. Smith met J. R. Jones, e.g. at St. Paul's. They talked."),
            ["Dr. Smith met J. R. Jones, e.g. at St. Paul's.", "They talked."]
        );
        // A lowercase single letter is a word, not an initial.
        assert_eq!(split("Plan a. Plan b."), ["Plan a.", "Plan b."]);
    }

    #[test]
    fn blank_lines_end_paragraphs_and_whitespace_is_collapsed() {
        assert_eq!(
            split("A title\n\nFirst   line\ncontinues here.\n"),
            ["A title", "First line continues here."]
        );
        assert!(split("  \n\n \t ").is_empty());
        assert!(split("").is_empty());
    }

    #[test]
    fn long_sentences_are_cut_at_a_comma_or_a_space() {
        let clause = "word ".repeat(50); // 250 characters
        let text = format!("{}, {}.", clause.trim(), clause.trim());
        let parts = split(&text);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert!(parts[0].ends_with(','), "{}", parts[0]);
        assert!(parts.iter().all(|p| p.chars().count() <= MAX_SENTENCE_CHARS));
        let unbroken = "x".repeat(MAX_SENTENCE_CHARS * 2 + 5);
        let parts = split(&unbroken);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [400, 400, 5]
        );
        // Nothing is lost.
        assert_eq!(parts.concat(), unbroken);
    }
}
