//! Where requests to user-named URLs may go: webhook deliveries (made by the
//! scheduler) and the URLs of model inputs (fetched by workers, such as the
//! keyframes of `interpolate-video`). Both are made from inside the
//! operator's network, so without a check they could reach loopback
//! services, the cloud metadata endpoint, the private network or Gantry's own
//! management API. The check is made on the address actually connected to: names are resolved by [`GuardedResolver`],
//! which drops every forbidden address (so a name that resolves to
//! `127.0.0.1` is refused, and a DNS answer cannot be swapped between a check
//! and the connection), and IP literals, which reqwest connects to without
//! resolving, are checked by [`AddressPolicy::check_url`]. Redirects are not
//! followed. Ranges the operator lists (`scheduler.webhook_allow_ranges`,
//! `video.fetch_allow_ranges`) are allowed anyway. [`client`] builds a
//! `reqwest` client with all of that in place.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod inputs;

pub use inputs::{Fetcher, OwnFiles, OwnRead, Source};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// An address range in CIDR notation, such as `10.1.0.0/16` or `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    network: IpAddr,
    prefix: u8,
}

impl IpRange {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("'{text}' is not an address range (CIDR, e.g. 10.0.0.0/8)"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{text}': the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { network, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let bits = usize::from(bits);
    let whole = bits / 8;
    if a[..whole] != b[..whole] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// Which destination addresses outbound requests may connect to.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    allowed: Vec<IpRange>,
}

impl AddressPolicy {
    /// Forbids loopback, private, link-local, shared, multicast and reserved
    /// addresses, except in `allowed`.
    pub fn new(allowed: &[String]) -> Result<Self, String> {
        let allowed = allowed
            .iter()
            .map(|text| IpRange::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { allowed })
    }

    /// Whether a request may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|range| range.contains(ip)) || is_public(ip)
    }

    /// Refuses a URL whose host is an IP literal the policy forbids (names
    /// are checked when they are resolved, by [`GuardedResolver`]).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        // The URL parser has already turned every spelling of an IPv4
        // address (`0x7f000001`, `2130706433`, `0177.0.0.1`) into dotted form.
        let Some(host) = url.host_str() else {
            return Err("the URL has no host".into());
        };
        let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let Ok(ip) = literal.parse::<IpAddr>() else {
            return Ok(());
        };
        if self.permits(ip) {
            Ok(())
        } else {
            Err(format!(
                "destination {ip} is not allowed (a loopback, private or reserved address)"
            ))
        }
    }
}

/// Public unicast addresses: everything but the special-purpose ranges
/// (IPv4-mapped and NAT64 IPv6 addresses are judged by their IPv4 address).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => is_public_v6(ip),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0                                   // "this network"
        || a == 10                             // private
        || a == 127                            // loopback
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 169 && b == 254)              // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0)      // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)      // documentation
        || (a == 192 && b == 168)              // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100)   // documentation
        || (a == 203 && b == 0 && c == 113)    // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., hi, lo] = segments;
        return is_public_v4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || segments[0] & 0xfe00 == 0xfc00 // unique local
        || segments[0] & 0xffc0 == 0xfe80 // link-local
        || segments[0] & 0xff00 == 0xff00 // multicast
        || segments[..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible (deprecated)
        || (segments[0] == 0x2001 && segments[1] == 0xdb8)) // documentation
}

/// Resolves host names and keeps only the addresses the policy permits.
pub struct GuardedResolver {
    pub policy: Arc<AddressPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let permitted: Vec<SocketAddr> = found.iter().copied().filter(|a| policy.permits(a.ip())).collect();
            if permitted.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> = if found.is_empty() {
                    format!("host {host} did not resolve").into()
                } else {
                    format!(
                        "host {host} resolves only to addresses that are not allowed ({})",
                        found.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
                    )
                    .into()
                };
                return Err(error);
            }
            let addrs: reqwest::dns::Addrs = Box::new(permitted.into_iter());
            Ok(addrs)
        })
    }
}

/// TLS for outbound requests: rustls with the ring provider, trusting the
/// system's CA certificates (or the built-in Mozilla roots where the system
/// has none) and the PEM certificates in `extra_ca`.
pub fn tls_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = extra_ca {
        let fail = |what: String| format!("{}: {what}", path.display());
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| fail(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("holds no certificate".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| fail(e.to_string()))?;
        }
    }
    let extra = roots.len();
    let native = rustls_native_certs::load_native_certs();
    let (system, _unparsable) = roots.add_parsable_certificates(native.certs);
    if system == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        tracing::info!(
            extra,
            "no system CA certificates; outbound https trusts the built-in Mozilla roots"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tls)
}

/// A client for user-named URLs: every connection checked by `policy`
/// (names through [`GuardedResolver`]; check IP literals with
/// [`AddressPolicy::check_url`] before sending), no redirect followed, each
/// request bounded by `timeout`.
pub fn client(
    policy: Arc<AddressPolicy>,
    timeout: Duration,
    tls: rustls::ClientConfig,
) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(timeout)
        .tls_backend_preconfigured(tls)
        .dns_resolver(Arc::new(GuardedResolver { policy }))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

/// `error` with its sources: reqwest's own message alone ("error sending
/// request") says neither that a certificate was refused nor that an
/// address was not allowed.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn special_purpose_addresses_are_refused_and_public_ones_allowed() {
        let policy = AddressPolicy::default();
        for refused in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::7f00:1",
            "::127.0.0.1",
        ] {
            assert!(!policy.permits(ip(refused)), "{refused}");
        }
        for allowed in ["8.8.8.8", "1.1.1.1", "172.32.0.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(policy.permits(ip(allowed)), "{allowed}");
        }
    }

    #[test]
    fn configured_ranges_are_allowed() {
        let policy = AddressPolicy::new(&["127.0.0.0/8".into(), "fd00::/8".into(), "10.1.2.3".into()]).unwrap();
        assert!(policy.permits(ip("127.0.0.1")) && policy.permits(ip("fd00::5")) && policy.permits(ip("10.1.2.3")));
        assert!(!policy.permits(ip("10.1.2.4")) && !policy.permits(ip("192.168.0.1")));
        for bad in ["nope", "10.0.0.0/33", "::/129", ""] {
            assert!(AddressPolicy::new(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn ip_literal_urls_are_checked_in_every_spelling() {
        let policy = AddressPolicy::default();
        for url in [
            "http://127.0.0.1:8080/hook",
            "http://[::ffff:127.0.0.1]/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://017700000001/",
            "http://user:pw@127.0.0.1/",
            "http://[::1]:9/",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            assert!(policy.check_url(&parsed).is_err(), "{url}");
        }
        assert!(
            policy
                .check_url(&reqwest::Url::parse("https://example.com/hook").unwrap())
                .is_ok()
        );
    }

    #[tokio::test]
    async fn names_resolving_to_forbidden_addresses_are_refused() {
        use reqwest::dns::Resolve;
        let resolver = GuardedResolver {
            policy: Arc::new(AddressPolicy::default()),
        };
        let error = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost resolved to an allowed address"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains("not allowed"), "{error}");
        let allowing = GuardedResolver {
            policy: Arc::new(AddressPolicy::new(&["127.0.0.0/8".into(), "::1/128".into()]).unwrap()),
        };
        assert!(allowing.resolve("localhost".parse().unwrap()).await.is_ok());
    }
}
