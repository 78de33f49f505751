//! English number words: the part of `num2words` that the reading of numbers
//! uses (cardinals, ordinals, years and decimals). The callers split the words
//! on anything that is not a letter, so the punctuation here ("one thousand,
//! two hundred and thirty-four") only has to match `num2words`' spelling.

use crate::G2pError;

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];
/// The names of the powers of a thousand; past the last one the reference
/// fails (an `IndexError`), and so does [`cardinal`].
const SCALES: [&str; 12] = [
    "",
    "thousand",
    "million",
    "billion",
    "trillion",
    "quadrillion",
    "quintillion",
    "sextillion",
    "septillion",
    "octillion",
    "nonillion",
    "decillion",
];

/// The error for a number the reader cannot say (shortened for the message).
pub(crate) fn unreadable(text: &str) -> G2pError {
    let mut shown: String = text.chars().take(40).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    G2pError::Number(shown)
}

/// A word of `ONES` (all indices used are below 20).
fn one(n: u128) -> &'static str {
    usize::try_from(n).ok().and_then(|n| ONES.get(n)).copied().unwrap_or("")
}

/// 0..=999 as words, with "and" after the hundreds ("one hundred and five").
fn below_1000(mut n: u128, words: &mut Vec<String>) {
    let start = words.len();
    if n >= 100 {
        words.push(one(n / 100).to_owned());
        words.push("hundred".to_owned());
        n %= 100;
        if n > 0 {
            words.push("and".to_owned());
        }
    }
    if n >= 20 {
        let tens = usize::try_from(n / 10)
            .ok()
            .and_then(|t| TENS.get(t))
            .copied()
            .unwrap_or("");
        if !n.is_multiple_of(10) {
            words.push(format!("{tens}-{}", one(n % 10)));
        } else {
            words.push(tens.to_owned());
        }
    } else if n > 0 || words.len() == start {
        words.push(one(n).to_owned());
    }
}

/// `num2words(n)`: "one thousand, two hundred and thirty-four"; a thousand
/// and a number below a hundred is joined with "and" ("one thousand and one").
pub(crate) fn cardinal(n: u128) -> Result<String, G2pError> {
    if n < 1000 {
        let mut words = Vec::new();
        below_1000(n, &mut words);
        return Ok(words.join(" "));
    }
    let mut groups = Vec::new();
    let mut rest = n;
    let mut scale = 0;
    while rest > 0 {
        let group = rest % 1000;
        rest /= 1000;
        if group > 0 {
            let name = SCALES.get(scale).ok_or_else(|| unreadable(&n.to_string()))?;
            let mut words = Vec::new();
            below_1000(group, &mut words);
            let mut text = words.join(" ");
            if scale > 0 {
                text.push(' ');
                text.push_str(name);
            }
            groups.push(text);
        }
        scale += 1;
    }
    groups.reverse();
    if let Some((last, head)) = groups.split_last() {
        let after_and = last.rsplit(" and ").next().unwrap_or(last);
        if !head.is_empty() && !after_and.contains(' ') && !last.contains("hundred") {
            return Ok(format!("{} and {last}", head.join(", ")));
        }
    }
    Ok(groups.join(", "))
}

/// The ordinal of one number word ("one" -> "first", "twenty" -> "twentieth").
fn ordinal_word(word: &str) -> String {
    match word {
        "one" => "first".to_owned(),
        "two" => "second".to_owned(),
        "three" => "third".to_owned(),
        "five" => "fifth".to_owned(),
        "eight" => "eighth".to_owned(),
        "nine" => "ninth".to_owned(),
        "twelve" => "twelfth".to_owned(),
        _ => match word.strip_suffix('y') {
            Some(stem) => format!("{stem}ieth"),
            None => format!("{word}th"),
        },
    }
}

/// `num2words(n, to="ordinal")`: the last word of the cardinal (or the last
/// part of a hyphenated one) becomes its ordinal.
pub(crate) fn ordinal(n: u128) -> Result<String, G2pError> {
    let words = cardinal(n)?;
    let (head, last) = match words.rfind(' ') {
        Some(at) => words.split_at(at + 1),
        None => ("", words.as_str()),
    };
    let last = match last.rfind('-') {
        Some(at) => format!("{}-{}", &last[..at], ordinal_word(&last[at + 1..])),
        None => ordinal_word(last),
    };
    Ok(format!("{head}{last}"))
}

/// `num2words(n, to="year")`: "nineteen oh-five", "twenty ten", "nineteen
/// hundred"; years like 2005 and 1000 are read as cardinals.
pub(crate) fn year(n: u128) -> Result<String, G2pError> {
    let (high, low) = (n / 100, n % 100);
    if high == 0 || (high % 10 == 0 && low < 10) || high >= 100 {
        return cardinal(n);
    }
    let low = match low {
        0 => "hundred".to_owned(),
        1..=9 => format!("oh-{}", cardinal(low)?),
        _ => cardinal(low)?,
    };
    Ok(format!("{} {low}", cardinal(high)?))
}

/// `num2words(float(s))` for a decimal written with a point: the integer part
/// as a cardinal, then "point" and each digit; trailing zeros are dropped as
/// `float()` drops them.
pub(crate) fn decimal(s: &str) -> Result<String, G2pError> {
    let (int_part, frac) = s.split_once('.').unwrap_or((s, ""));
    let frac = frac.trim_end_matches('0');
    let whole = if int_part.is_empty() {
        0
    } else {
        crate::pystr::parse_int(int_part).ok_or_else(|| unreadable(s))?
    };
    let mut words = cardinal(whole)?;
    if !frac.is_empty() {
        words.push_str(" point");
        for c in frac.chars() {
            let digit = crate::pystr::parse_int(c.encode_utf8(&mut [0; 4])).ok_or_else(|| unreadable(s))?;
            words.push(' ');
            words.push_str(one(digit));
        }
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cardinals_read_like_num2words() {
        let cases = [
            (0, "zero"),
            (7, "seven"),
            (19, "nineteen"),
            (20, "twenty"),
            (42, "forty-two"),
            (100, "one hundred"),
            (105, "one hundred and five"),
            (999, "nine hundred and ninety-nine"),
            (1000, "one thousand"),
            (1001, "one thousand and one"),
            (1099, "one thousand and ninety-nine"),
            (1100, "one thousand, one hundred"),
            (1234, "one thousand, two hundred and thirty-four"),
            (2_000_020, "two million and twenty"),
            (7_900_000_000, "seven billion, nine hundred million"),
        ];
        for (n, words) in cases {
            assert_eq!(cardinal(n).unwrap(), words, "{n}");
        }
        assert!(cardinal(10u128.pow(36)).is_err(), "past decillion, as the reference");
        assert!(cardinal(10u128.pow(36) - 1).is_ok());
    }

    #[test]
    fn ordinals_years_and_decimals() {
        assert_eq!(ordinal(1).unwrap(), "first");
        assert_eq!(ordinal(22).unwrap(), "twenty-second");
        assert_eq!(ordinal(40).unwrap(), "fortieth");
        assert_eq!(ordinal(101).unwrap(), "one hundred and first");
        assert_eq!(ordinal(1000).unwrap(), "one thousandth");
        assert_eq!(ordinal(112).unwrap(), "one hundred and twelfth");
        assert_eq!(year(1905).unwrap(), "nineteen oh-five");
        assert_eq!(year(1900).unwrap(), "nineteen hundred");
        assert_eq!(year(2005).unwrap(), "two thousand and five");
        assert_eq!(year(2010).unwrap(), "twenty ten");
        assert_eq!(year(1066).unwrap(), "ten sixty-six");
        assert_eq!(year(999).unwrap(), "nine ninety-nine");
        assert_eq!(decimal("3.14159").unwrap(), "three point one four one five nine");
        assert_eq!(decimal("2.50").unwrap(), "two point five");
        assert_eq!(decimal("7.0").unwrap(), "seven");
        assert_eq!(decimal(".5").unwrap(), "zero point five");
    }
}
