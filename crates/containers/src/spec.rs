//! The shapes of templates, registries and endpoints, and the rules their
//! fields follow. The API parses request bodies into plain values and checks
//! them here, so a template and an endpoint refuse the same image or port
//! with the same words.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest name of a template, registry or endpoint.
pub const NAME_MAX: usize = 191;
/// Largest container disk, in GB.
pub const DISK_MAX_GB: u32 = 2048;
/// Most environment variables of one container.
pub const ENV_MAX: usize = 256;
/// Longest environment value, in bytes.
pub const ENV_VALUE_MAX: usize = 32 * 1024;
/// Longest `args` string.
pub const ARGS_MAX: usize = 8192;
/// Most exposed ports of one container.
pub const PORTS_MAX: usize = 32;
/// Most workers of one endpoint.
pub const WORKERS_MAX: u32 = 100;
/// Longest per-job timeout of an endpoint, in milliseconds (a day).
pub const TIMEOUT_MAX_MS: u64 = 86_400_000;

/// What every containerised resource carries: the image and how it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Image reference (`[registry/]name[:tag][@digest]`).
    #[schema(example = "registry.example.com/team/worker:1")]
    pub image: String,
    /// Arguments of the image's entrypoint, one string split like a shell
    /// would (quotes group, no expansion). Empty: the image's own command.
    pub args: String,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Exposed ports as `port/protocol` (`http`, `tcp` or `udp`).
    #[schema(example = json!(["8000/http"]))]
    pub ports: Vec<String>,
    /// Container disk in GB.
    #[schema(minimum = 1, maximum = 2048)]
    pub disk: u32,
    /// Id of the registry credential the image is pulled with.
    pub registry: Option<String>,
}

/// A reusable container configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub id: String,
    pub name: String,
    #[serde(flatten)]
    pub container: Container,
    pub mounts: TemplateMounts,
    /// For serverless workers (true) or pods (false).
    pub serverless: bool,
    /// Visible to every user in `/v2/catalog/templates`.
    pub public: bool,
    pub category: TemplateCategory,
    pub start_ssh: bool,
    pub start_jupyter: bool,
    pub allowed_cuda_versions: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateMounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<PersistentMount>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PersistentMount {
    /// GB, at least 10.
    #[schema(minimum = 10, maximum = 4096)]
    pub size: u32,
    /// Absolute path inside the container.
    pub path: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum TemplateCategory {
    Cpu,
    #[default]
    Nvidia,
    Amd,
}

/// A registry credential; the username and password are never shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Registry {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EndpointType {
    /// Jobs through the queue (`run`, `runsync`, ...).
    #[default]
    Queue,
    /// Requests straight to the workers' own HTTP server (not served here).
    LoadBalancer,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlashBoot {
    #[default]
    Off,
    Flashboot,
    PriorityFlashboot,
}

/// How many workers an endpoint may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workers {
    #[schema(minimum = 0, maximum = 100)]
    pub min: u32,
    #[schema(minimum = 0, maximum = 100)]
    pub max: u32,
    /// Seconds an idle worker lives before it is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    pub idle_timeout: Option<u32>,
}

/// The autoscaling signal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum Scaling {
    /// A worker for every `queueDelay` seconds the oldest queued job has waited.
    #[serde(rename_all = "camelCase")]
    QueueDelay {
        #[schema(minimum = 0.5)]
        queue_delay: f64,
    },
    /// A worker for every `requestCount` jobs queued or running.
    #[serde(rename_all = "camelCase")]
    RequestCount {
        #[schema(minimum = 1)]
        request_count: u32,
    },
}

/// GPUs of each worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointGpu {
    /// GPU pools (`pool` of `/v2/catalog/gpus`).
    pub pools: Vec<String>,
    pub excluded_types: Vec<String>,
    /// GPUs per worker.
    #[schema(minimum = 1)]
    pub count: u32,
    pub allowed_cuda_versions: Vec<String>,
    pub min_cuda_version: Option<String>,
}

/// CPUs of each worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuConfig {
    /// CPU flavor (`id` of `/v2/catalog/cpus`).
    pub id: String,
    #[schema(minimum = 2)]
    pub vcpu_count: u32,
    /// Memory in GB (the flavor's RAM per vCPU × vCPUs).
    #[schema(minimum = 1)]
    pub memory: u32,
}

/// The URLs of an endpoint's jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestUrls {
    pub run: String,
    pub run_sync: String,
    pub status: String,
    pub stream: String,
    pub cancel: String,
    pub retry: String,
    pub purge_queue: String,
    pub health: String,
}

impl RequestUrls {
    /// The URLs under `base` (the public listener's origin).
    pub fn under(base: &str, endpoint_id: &str) -> Self {
        let root = format!("{}/v2/{endpoint_id}", base.trim_end_matches('/'));
        Self {
            run: format!("{root}/run"),
            run_sync: format!("{root}/runsync"),
            status: format!("{root}/status/{{job_id}}"),
            stream: format!("{root}/stream/{{job_id}}"),
            cancel: format!("{root}/cancel/{{job_id}}"),
            retry: format!("{root}/retry/{{job_id}}"),
            purge_queue: format!("{root}/purge-queue"),
            health: format!("{root}/health"),
        }
    }
}

/// What an endpoint is: everything a user set, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EndpointType,
    #[serde(flatten)]
    pub container: Container,
    pub gpu: Option<EndpointGpu>,
    pub cpu: Option<Vec<CpuConfig>>,
    pub workers: Workers,
    pub scaling: Scaling,
    pub data_center_ids: Vec<String>,
    pub network_volumes: Vec<String>,
    /// Per-job execution timeout, ms.
    pub timeout: u64,
    pub flashboot: FlashBoot,
    /// The template it was made from, if any (a template in use cannot be deleted).
    #[serde(default)]
    pub template_id: Option<String>,
}

/// An endpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EndpointType,
    #[serde(flatten)]
    pub container: Container,
    pub request_urls: RequestUrls,
    pub gpu: Option<EndpointGpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Vec<CpuConfig>>,
    pub workers: Workers,
    pub scaling: Scaling,
    pub data_center_ids: Vec<String>,
    pub network_volumes: Vec<String>,
    /// Per-job execution timeout, ms.
    pub timeout: u64,
    pub flashboot: FlashBoot,
    /// The configuration version: one more for every change of image,
    /// args, env, ports, disk, registry or compute (a release).
    pub version: u32,
    #[schema(format = DateTime)]
    pub created_at: String,
}

/// A change of an endpoint's workers' configuration.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    /// `<endpoint id>-v<version>`.
    pub id: String,
    pub version: u32,
    /// Always `MANUAL` here (no builds from git).
    pub source: String,
    pub created_by_user_id: String,
    /// Workers running this version now.
    pub worker_count: u32,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub diff: Vec<DiffEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DiffEntry {
    pub field: String,
    #[schema(value_type = Object)]
    pub old: serde_json::Value,
    #[schema(value_type = Object)]
    pub new: serde_json::Value,
}

/// A name: 1 to 191 characters, none of them a control character.
pub fn check_name(name: &str) -> Result<(), String> {
    let count = name.chars().count();
    if count == 0 || name.trim().is_empty() {
        Err("must not be empty or blank".into())
    } else if count > NAME_MAX {
        Err(format!("must be at most {NAME_MAX} characters (got {count})"))
    } else if name.chars().any(char::is_control) {
        Err("must not contain control characters".into())
    } else {
        Ok(())
    }
}

/// An image reference as Docker reads it: `[host[:port]/]path[:tag][@digest]`,
/// path components lowercase letters and digits joined by `.`, `_`, `__` or
/// `-`; a tag of at most 128 word characters, dots and dashes; a digest
/// `algorithm:hex`.
pub fn check_image(image: &str) -> Result<(), String> {
    const RULE: &str =
        "must be an image reference such as 'name:tag', 'registry.example.com/team/name:tag' or 'name@sha256:<hex>'";
    if image.is_empty() {
        return Err("must not be empty".into());
    }
    if image.len() > 512 {
        return Err("must be at most 512 characters".into());
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let ok = digest.split_once(':').is_some_and(|(algo, hex)| {
            !algo.is_empty()
                && algo
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c))
                && hex.len() >= 32
                && hex.chars().all(|c| c.is_ascii_hexdigit())
        });
        if !ok {
            return Err(format!("{RULE}: the digest is malformed"));
        }
    }
    // A tag follows the last ':' that comes after the last '/'.
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let first_ok = tag
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok || tag.len() > 128 || !tag.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err(format!("{RULE}: the tag '{tag}' is malformed"));
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // The first part is a registry host when it has a '.', a ':' or is localhost.
    if parts.len() > 1 && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (host_name, port) = match host.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        };
        let host_ok = !host_name.is_empty()
            && host_name
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
        if !host_ok || !port_ok {
            return Err(format!("{RULE}: the registry host '{host}' is malformed"));
        }
    }
    for part in &parts {
        if !path_component(part) {
            return Err(format!(
                "{RULE}: '{part}' is not a valid name component (lowercase letters, digits and single separators)"
            ));
        }
    }
    Ok(())
}

fn path_component(part: &str) -> bool {
    let bytes = part.as_bytes();
    if bytes.is_empty() || !is_alnum(bytes[0]) || !is_alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if is_alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: '.', '_', '__' or one or more '-'.
        let start = i;
        while i < bytes.len() && !is_alnum(bytes[i]) {
            i += 1;
        }
        let sep = &part[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-')) {
            return false;
        }
    }
    true
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// One exposed port: `port/protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub number: u16,
    pub protocol: PortProtocol,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortProtocol {
    Http,
    Tcp,
    Udp,
}

/// Parses `8888/http`, `22/tcp`, `53/udp`.
pub fn parse_port(text: &str) -> Result<Port, String> {
    let Some((number, protocol)) = text.split_once('/') else {
        return Err(format!("'{text}' must be written port/protocol, e.g. '8888/http'"));
    };
    let number = number
        .parse::<u16>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{text}': the port must be a number from 1 to 65535"))?;
    let protocol = match protocol {
        "http" => PortProtocol::Http,
        "tcp" => PortProtocol::Tcp,
        "udp" => PortProtocol::Udp,
        _ => return Err(format!("'{text}': the protocol must be http, tcp or udp")),
    };
    Ok(Port { number, protocol })
}

/// Every problem of a port list.
pub fn check_ports(ports: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if ports.len() > PORTS_MAX {
        problems.push(format!("at most {PORTS_MAX} ports (got {})", ports.len()));
    }
    let mut seen: Vec<(u16, bool)> = Vec::new();
    for text in ports {
        match parse_port(text) {
            Ok(port) => {
                let udp = port.protocol == PortProtocol::Udp;
                if seen.contains(&(port.number, udp)) {
                    problems.push(format!("'{text}': port {} is listed twice", port.number));
                }
                seen.push((port.number, udp));
            }
            Err(problem) => problems.push(problem),
        }
    }
    problems
}

/// Every problem of an environment: names as POSIX shells take them, values
/// without NUL or line breaks (they would be cut or split on the way in).
pub fn check_env(env: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if env.len() > ENV_MAX {
        problems.push(format!("at most {ENV_MAX} variables (got {})", env.len()));
    }
    for (name, value) in env {
        let shown: String = name.escape_debug().take(64).collect();
        let name_ok = !name.is_empty()
            && name.len() <= 256
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            problems.push(format!(
                "'{shown}' is not a variable name (letters, digits and '_', not starting with a digit)"
            ));
        }
        if value.contains(['\0', '\n', '\r']) {
            problems.push(format!("{shown}: the value must not contain NUL or line breaks"));
        } else if value.len() > ENV_VALUE_MAX {
            problems.push(format!("{shown}: the value must be at most {ENV_VALUE_MAX} bytes"));
        }
    }
    problems
}

/// Splits `args` into words the way a POSIX shell would group them: blanks
/// separate, single quotes keep everything, double quotes keep all but `\"`
/// and `\\`, a backslash outside quotes escapes the next character. No
/// variables, globs or substitutions: the words reach the image as they are.
pub fn split_args(args: &str) -> Result<Vec<String>, String> {
    if args.len() > ARGS_MAX {
        return Err(format!("must be at most {ARGS_MAX} bytes"));
    }
    if args.contains('\0') {
        return Err("must not contain NUL".into());
    }
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = args.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("has an unclosed single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("has an unclosed double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("has an unclosed double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err("ends with a lone backslash".into()),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Every problem of a container's fields, each as `(field, problem)`.
pub fn check_container(container: &Container) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Err(problem) = check_image(&container.image) {
        problems.push(("image", problem));
    }
    if let Err(problem) = split_args(&container.args) {
        problems.push(("args", problem));
    }
    problems.extend(check_env(&container.env).into_iter().map(|p| ("env", p)));
    problems.extend(check_ports(&container.ports).into_iter().map(|p| ("ports", p)));
    if !(1..=DISK_MAX_GB).contains(&container.disk) {
        problems.push((
            "disk",
            format!("must be from 1 to {DISK_MAX_GB} GB (got {})", container.disk),
        ));
    }
    problems
}

/// Whether `version` is `major.minor`.
pub fn is_cuda_version(version: &str) -> bool {
    version
        .split_once('.')
        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a.chars().chain(b.chars()).all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        for good in [
            "busybox",
            "gantry-test/busybox:1",
            "registry.example.com:5000/team/app:v1.2-rc_3",
            "localhost/a/b",
            "docker.io/library/python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "a__b/c.d-e--f:latest",
        ] {
            assert_eq!(check_image(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "UPPER/case",
            "name:",
            "name:-tag",
            "na me",
            "name@sha256:xyz",
            "/leading",
            "trailing/",
            "a..b",
            "host:99999/x",
            "a___b",
        ] {
            assert!(check_image(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_and_env() {
        assert!(check_ports(&["8888/http".into(), "22/tcp".into(), "22/udp".into()]).is_empty());
        let problems = check_ports(&[
            "0/tcp".into(),
            "70000/tcp".into(),
            "80/sctp".into(),
            "80".into(),
            "1/tcp".into(),
            "1/http".into(),
        ]);
        assert_eq!(problems.len(), 5, "{problems:?}");
        let env: BTreeMap<String, String> = [
            ("GOOD_1".to_string(), "x".to_string()),
            ("1BAD".into(), "x".into()),
            ("NL".into(), "a\nb".into()),
            ("NUL".into(), "a\0".into()),
        ]
        .into();
        assert_eq!(check_env(&env).len(), 3);
    }

    #[test]
    fn args_split_like_a_shell() {
        assert_eq!(split_args("").unwrap_or_default(), Vec::<String>::new());
        assert_eq!(
            split_args(r#"python -u "/opt/a b.py" --x='1 2' \"q\" "say \"hi\"""#).ok(),
            Some(vec![
                "python".to_string(),
                "-u".into(),
                "/opt/a b.py".into(),
                "--x=1 2".into(),
                "\"q\"".into(),
                "say \"hi\"".into()
            ])
        );
        assert!(split_args("'open").is_err());
        assert!(split_args("\"open").is_err());
        assert!(split_args("end\\").is_err());
        assert_eq!(split_args("''").ok(), Some(vec![String::new()]));
    }
}
