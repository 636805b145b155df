//! How much of the machine tenants may hold at once: sandboxes and runs in progress, per
//! tenant and for all tenants together, so that no tenant can exhaust the host and none can
//! starve the others. The [`Registry`](crate::Registry) enforces them; a refusal is an
//! [`Error::Quota`](crate::Error::Quota) naming the [`Limit`] that was hit.

use std::fmt;
use std::sync::Arc;

/// Limits on one tenant. `None`: no limit of its own (the server-wide caps still hold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantQuota {
    /// Sandboxes the tenant may hold at once. A one-shot run's sandbox is not held: it
    /// counts as a run, against [`TenantQuota::max_concurrent_runs`] (and against the
    /// server's total of sandboxes while it runs).
    pub max_sandboxes: Option<usize>,
    /// Runs (code, commands, package installs) the tenant may have in progress at once.
    pub max_concurrent_runs: Option<usize>,
}

impl TenantQuota {
    /// `self`'s limits, with `fallback`'s where `self` sets none.
    pub fn or(self, fallback: TenantQuota) -> TenantQuota {
        TenantQuota {
            max_sandboxes: self.max_sandboxes.or(fallback.max_sandboxes),
            max_concurrent_runs: self.max_concurrent_runs.or(fallback.max_concurrent_runs),
        }
    }
}

/// A tenant's own limits, when the operator set some for it (in the tokens file, say).
pub type QuotaLookup = Arc<dyn Fn(&str) -> Option<TenantQuota> + Send + Sync>;

/// Every limit the registry enforces.
#[derive(Clone, Default)]
pub struct Quotas {
    /// Sandboxes of all tenants together (the warm pool excluded).
    pub max_sandboxes: Option<usize>,
    /// Runs in progress for all tenants together.
    pub max_concurrent_runs: Option<usize>,
    /// Every tenant's limits unless [`Quotas::lookup`] gives its own.
    pub per_tenant: TenantQuota,
    /// Tenants' own limits; a limit they leave unset falls back to [`Quotas::per_tenant`].
    pub lookup: Option<QuotaLookup>,
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quotas")
            .field("max_sandboxes", &self.max_sandboxes)
            .field("max_concurrent_runs", &self.max_concurrent_runs)
            .field("per_tenant", &self.per_tenant)
            .field("lookup", &self.lookup.is_some())
            .finish()
    }
}

impl Quotas {
    /// The limits that hold for `tenant`.
    pub fn of(&self, tenant: &str) -> TenantQuota {
        match &self.lookup {
            Some(lookup) => lookup(tenant).unwrap_or_default().or(self.per_tenant),
            None => self.per_tenant,
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The tenant holds as many sandboxes as it may.
    TenantSandboxes,
    /// The tenant has as many runs in progress as it may.
    TenantRuns,
    /// The server holds as many sandboxes as it may, all tenants together.
    Sandboxes,
    /// The server has as many runs in progress as it may, all tenants together.
    Runs,
}

impl Limit {
    /// A stable name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::TenantSandboxes => "tenant_sandboxes",
            Limit::TenantRuns => "tenant_runs",
            Limit::Sandboxes => "server_sandboxes",
            Limit::Runs => "server_runs",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_own_limits_fall_back_to_the_defaults_one_by_one() {
        let quotas = Quotas {
            per_tenant: TenantQuota {
                max_sandboxes: Some(4),
                max_concurrent_runs: Some(2),
            },
            lookup: Some(Arc::new(|t: &str| {
                (t == "big").then_some(TenantQuota {
                    max_sandboxes: Some(40),
                    max_concurrent_runs: None,
                })
            })),
            ..Quotas::default()
        };
        assert_eq!(
            quotas.of("big"),
            TenantQuota {
                max_sandboxes: Some(40),
                max_concurrent_runs: Some(2)
            }
        );
        assert_eq!(quotas.of("small"), quotas.per_tenant);
        assert_eq!(Quotas::default().of("any"), TenantQuota::default());
    }
}
