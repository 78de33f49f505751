use std::fmt;

/// One permission: an area of the platform and an action on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    VolumesRead,
    VolumesWrite,
    CatalogRead,
    BillingRead,
    EndpointsRun,
    /// Read serverless endpoints, templates and registry credentials (names only).
    EndpointsRead,
    /// Create, change and delete them.
    EndpointsWrite,
    /// Read pods, their logs, and the account's SSH keys.
    PodsRead,
    /// Create, start, stop, change and delete pods; set the SSH keys.
    PodsWrite,
}

impl Scope {
    pub const ALL: [Scope; 9] = [
        Scope::VolumesRead,
        Scope::VolumesWrite,
        Scope::CatalogRead,
        Scope::BillingRead,
        Scope::EndpointsRun,
        Scope::EndpointsRead,
        Scope::EndpointsWrite,
        Scope::PodsRead,
        Scope::PodsWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::VolumesRead => "volumes:read",
            Scope::VolumesWrite => "volumes:write",
            Scope::CatalogRead => "catalog:read",
            Scope::BillingRead => "billing:read",
            Scope::EndpointsRun => "endpoints:run",
            Scope::EndpointsRead => "endpoints:read",
            Scope::EndpointsWrite => "endpoints:write",
            Scope::PodsRead => "pods:read",
            Scope::PodsWrite => "pods:write",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope '{0}': use {known}, or the presets 'all' and 'read-only'", known = Scope::ALL.map(Scope::as_str).join(", "))]
pub struct ScopeParseError(pub String);

/// A set of scopes, stored as a space-separated list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScopeSet(u16);

impl ScopeSet {
    pub fn all() -> Self {
        Scope::ALL.into_iter().collect()
    }

    /// Every `:read` scope and nothing that changes state or spends money.
    pub fn read_only() -> Self {
        [
            Scope::VolumesRead,
            Scope::CatalogRead,
            Scope::BillingRead,
            Scope::EndpointsRead,
            Scope::PodsRead,
        ]
        .into_iter()
        .collect()
    }

    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// Parses a comma- or space-separated list of scopes and presets.
    pub fn parse(text: &str) -> Result<Self, ScopeParseError> {
        let mut set = ScopeSet::default();
        for word in text.split([',', ' ']).map(str::trim).filter(|w| !w.is_empty()) {
            set.0 |= match word {
                "all" => ScopeSet::all().0,
                "read-only" => ScopeSet::read_only().0,
                other => Scope::ALL
                    .into_iter()
                    .find(|s| s.as_str() == other)
                    .ok_or_else(|| ScopeParseError(other.to_string()))?
                    .bit(),
            };
        }
        Ok(set)
    }

    pub fn to_storage(self) -> String {
        self.iter().map(Scope::as_str).collect::<Vec<_>>().join(" ")
    }
}

impl FromIterator<Scope> for ScopeSet {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        ScopeSet(iter.into_iter().fold(0, |acc, s| acc | s.bit()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_lists_parse() {
        assert_eq!(ScopeSet::parse("all"), Ok(ScopeSet::all()));
        let ro = ScopeSet::parse("read-only").unwrap_or_default();
        assert!(ro.contains(Scope::VolumesRead) && !ro.contains(Scope::VolumesWrite));
        assert!(!ro.contains(Scope::EndpointsRun));
        let set = ScopeSet::parse("volumes:read, endpoints:run").unwrap_or_default();
        assert_eq!(set.to_storage(), "volumes:read endpoints:run");
        assert_eq!(ScopeSet::parse(&set.to_storage()), Ok(set));
        assert!(ScopeSet::parse("volumes:delete").is_err());
    }
}
