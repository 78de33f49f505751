//! HTML for the console: escaping, the page frame, tables and charts.
//! Nothing here writes a `style` attribute or an inline script (the
//! Content-Security-Policy forbids both).
use std::fmt::Write as _;

use actix_web::HttpResponse;
use actix_web::http::header;
use gantry_auth::{ConsoleSession, Role};

/// Escapes text for HTML content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `12.345678` USD as people read it: `$12.35`, or more digits under a cent.
pub fn usd(micro_usd: i64) -> String {
    let dollars = micro_usd as f64 / 1e6;
    if micro_usd != 0 && micro_usd.abs() < 10_000 {
        format!("${dollars:.6}")
    } else {
        format!("${dollars:.2}")
    }
}

/// A Unix-milliseconds time as `2026-11-28 13:05:09 UTC`.
pub fn time(ms: i64) -> String {
    let text = gantry_billing::history::format_rfc3339(ms - ms.rem_euclid(1000));
    text.replacen('T', " ", 1).replace('Z', " UTC")
}

/// A duration in milliseconds, short.
pub fn duration(ms: i64) -> String {
    match ms {
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms => format!("{:.1} min", ms as f64 / 60_000.0),
    }
}

/// The pages of the navigation: (path, label, operators only).
const NAV: [(&str, &str, bool); 10] = [
    ("/console", "Overview", false),
    ("/console/playground", "Playground", false),
    ("/console/jobs", "Jobs", false),
    ("/console/keys", "API keys", false),
    ("/console/volumes", "Volumes", false),
    ("/console/templates", "Templates", false),
    ("/console/endpoints", "Endpoints", false),
    ("/console/pods", "Pods", false),
    ("/console/billing", "Billing", false),
    ("/console/admin", "Operators", true),
];

fn head(title: &str, csrf: Option<&str>) -> String {
    let mut out = String::with_capacity(2048);
    out.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    if let Some(csrf) = csrf {
        let _ = write!(out, "<meta name=\"csrf-token\" content=\"{}\">", esc(csrf));
    }
    let _ = write!(
        out,
        "<title>{} · Gantry</title><link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head><body>",
        esc(title)
    );
    out.push_str("<a class=\"skip\" href=\"#main\">Skip to content</a>");
    out
}

/// A signed-in page: the navigation (the current page marked), who is signed
/// in, sign-out, and `body` under an `<h1>` of `title`.
pub fn page(session: &ConsoleSession, current: &str, title: &str, body: &str) -> HttpResponse {
    let mut out = head(title, Some(&session.csrf));
    out.push_str(
        "<header class=\"top\"><a class=\"brand\" href=\"/console\">Gantry</a><nav aria-label=\"Console\"><ul>",
    );
    for (path, label, admin_only) in NAV {
        if admin_only && session.user.role != Role::Admin {
            continue;
        }
        let here = if path == current { " aria-current=\"page\"" } else { "" };
        let _ = write!(out, "<li><a href=\"{path}\"{here}>{label}</a></li>");
    }
    let _ = write!(
        out,
        "</ul></nav><form class=\"who\" method=\"post\" action=\"/console/sign-out\">\
         <span>{}</span><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button type=\"submit\">Sign out</button></form></header>",
        esc(&session.user.email),
        esc(&session.csrf)
    );
    let _ = write!(
        out,
        "<main id=\"main\"><h1>{}</h1>{body}</main></body></html>",
        esc(title)
    );
    html(out)
}

/// A page for someone not signed in (the sign-in and sign-up forms).
pub fn bare_page(title: &str, body: &str) -> String {
    let mut out = head(title, None);
    let _ = write!(
        out,
        "<main id=\"main\" class=\"narrow\"><p class=\"brand\">Gantry</p><h1>{}</h1>{body}</main></body></html>",
        esc(title)
    );
    out
}

pub fn html(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .body(body)
}

/// An error as a page (a page request that failed), with the problem's status.
pub fn error_page_with(status: actix_web::http::StatusCode, detail: &str) -> HttpResponse {
    let body = bare_page(
        status.canonical_reason().unwrap_or("Error"),
        &format!(
            "<p>{}</p><p><a href=\"/console\">Back to the console</a></p>",
            esc(detail)
        ),
    );
    HttpResponse::build(status)
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .body(body)
}

/// A bar chart as inline SVG: one bar per `(label, value)`, scaled to the
/// largest; each bar says its label and value to screen readers and on hover.
pub fn bar_chart(caption: &str, bars: &[(String, i64)], value_label: impl Fn(i64) -> String) -> String {
    let max = bars.iter().map(|(_, v)| *v).max().unwrap_or(0).max(1);
    let n = bars.len().max(1);
    let (width, height) = (600.0_f64, 160.0_f64);
    let slot = width / n as f64;
    let mut out = String::with_capacity(bars.len() * 160 + 256);
    let _ = write!(
        out,
        "<figure class=\"chart\"><svg viewBox=\"0 0 {width} {h}\" role=\"img\" aria-label=\"{}\" preserveAspectRatio=\"none\">",
        esc(caption),
        h = height + 2.0
    );
    for (i, (label, value)) in bars.iter().enumerate() {
        let bar = (*value as f64 / max as f64) * height;
        let x = i as f64 * slot + slot * 0.1;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bar:.1}\" class=\"bar\"><title>{}: {}</title></rect>",
            height - bar,
            slot * 0.8,
            esc(label),
            esc(&value_label(*value))
        );
    }
    let peak = bars.iter().max_by_key(|(_, v)| *v).filter(|(_, v)| *v > 0);
    let range = match (bars.first(), bars.last(), peak) {
        (Some((first, _)), Some((last, _)), Some((at, value))) => format!(
            " · {} to {}; the highest, {}, on {}",
            esc(first),
            esc(last),
            esc(&value_label(*value)),
            esc(at)
        ),
        (Some((first, _)), Some((last, _)), None) => format!(" · {} to {}; nothing yet", esc(first), esc(last)),
        _ => String::new(),
    };
    let _ = write!(
        out,
        "<line x1=\"0\" y1=\"{height}\" x2=\"{width}\" y2=\"{height}\" class=\"axis\"/></svg><figcaption>{}{range}</figcaption></figure>",
        esc(caption)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_every_character_that_could_end_text_or_an_attribute() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(url_encode("/console/keys?a=b c"), "/console/keys%3Fa%3Db%20c");
    }

    #[test]
    fn money_reads_as_people_expect() {
        assert_eq!(usd(12_345_678), "$12.35");
        assert_eq!(usd(0), "$0.00");
        assert_eq!(usd(460), "$0.000460");
    }
}
