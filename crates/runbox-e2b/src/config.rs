//! What the e2b backend talks to: the provider (chosen from the domain), where its three
//! HTTP surfaces are, the key, the template, and the timeouts.

use std::time::Duration;

use runbox_core::{Credential, Limits};

/// E2B's own domain.
pub const E2B_DOMAIN: &str = "e2b.app";
/// Novita's current default domain.
pub const NOVITA_DOMAIN: &str = "us-phx-1.sandbox.novita.ai";
/// The template with the code interpreter (port 49999) on both providers.
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";

/// Port of envd, the daemon in every sandbox (processes and files).
pub const ENVD_PORT: u16 = 49983;
/// Port of the code interpreter of the `code-interpreter` templates.
pub const INTERPRETER_PORT: u16 = 49999;

/// Which provider's quirks apply (see `docs/E2B_PROTOCOL.md` in the design notes, §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// E2B (`e2b.app`, or any domain that is not Novita's).
    E2b,
    /// Novita's current API (`*.sandbox.novita.ai`, secured sandboxes).
    Novita,
    /// Novita's legacy domains: composite `{sandboxID}-{clientID}` ids, unsecured sandboxes
    /// by default, camelCase create bodies.
    NovitaLegacy,
}

/// Novita domains served by the legacy API.
const NOVITA_LEGACY_DOMAINS: &[&str] = &[
    "sandbox.novita.ai",
    "sandbox-dev.novita.ai",
    "us-01.sandbox.novita.ai",
    "us-ga-01.sandbox.novita.ai",
    "us-ga-1.sandbox.novita.ai",
];

impl Provider {
    /// The provider serving `domain`.
    pub fn from_domain(domain: &str) -> Self {
        let d = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        if NOVITA_LEGACY_DOMAINS.contains(&d.as_str()) {
            Provider::NovitaLegacy
        } else if d == "novita.ai" || d.ends_with(".novita.ai") {
            Provider::Novita
        } else {
            Provider::E2b
        }
    }

    /// A name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Provider::E2b => "E2B",
            Provider::Novita | Provider::NovitaLegacy => "Novita",
        }
    }

    /// The environment variables holding an API key for this provider, in order.
    pub fn key_variables(self) -> &'static [&'static str] {
        match self {
            Provider::E2b => &["E2B_API_KEY"],
            Provider::Novita | Provider::NovitaLegacy => &["NOVITA_API_KEY", "E2B_API_KEY"],
        }
    }

    /// The names of the routing headers envd requests carry (id, port), if any.
    pub(crate) fn routing_headers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Provider::E2b => Some(("E2b-Sandbox-Id", "E2b-Sandbox-Port")),
            Provider::Novita => Some(("Novita-Sandbox-Id", "Novita-Sandbox-Port")),
            Provider::NovitaLegacy => None,
        }
    }
}

/// Configuration of the e2b backend.
#[derive(Clone)]
pub struct E2bConfig {
    /// The provider's domain: `e2b.app`, a Novita domain, or a self-hosted one.
    pub domain: String,
    /// The provider, normally [`Provider::from_domain`] of `domain`.
    pub provider: Provider,
    /// The template sandboxes are made from; it must run the code interpreter on port 49999
    /// for `run_code`.
    pub template: String,
    /// The operator's key; `None` when every sandbox is made with the caller's own key
    /// (`--auth passthrough`).
    pub api_key: Option<Credential>,
    /// The control plane's base URL; `None`: `https://api.{domain}`.
    pub api_url: Option<String>,
    /// The base URL of a port of a sandbox, with `{port}`, `{sandbox_id}` and `{domain}`
    /// substituted; `None`: `https://{port}-{sandbox_id}.{domain}`.
    pub sandbox_url: Option<String>,
    /// How long a control-plane or envd request (not a run) may take.
    pub request_timeout: Duration,
    /// How long a sandbox lives at the provider when nothing tells it otherwise (sandboxes
    /// of the pool); a sandbox's own idle timeout wins.
    pub default_lifetime: Duration,
    /// How much longer than one and a half idle timeouts the provider is asked to keep a
    /// sandbox (the room for a run in progress when the timer is pushed on).
    pub lifetime_margin: Duration,
    /// Retries of a request the provider refused for now (429, 502, 503, 504).
    pub max_retries: u32,
    /// The limits reported for every sandbox; the template decides memory and CPU, runbox
    /// applies only `output_bytes`.
    pub limits: Limits,
}

impl std::fmt::Debug for E2bConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bConfig")
            .field("domain", &self.domain)
            .field("provider", &self.provider)
            .field("template", &self.template)
            .field("api_key", &self.api_key)
            .field("api_url", &self.api_url)
            .field("sandbox_url", &self.sandbox_url)
            .field("request_timeout", &self.request_timeout)
            .field("default_lifetime", &self.default_lifetime)
            .field("lifetime_margin", &self.lifetime_margin)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

impl E2bConfig {
    /// The configuration for `domain`, with its provider's defaults.
    pub fn new(domain: impl Into<String>) -> Self {
        let domain = domain.into();
        let provider = Provider::from_domain(&domain);
        Self {
            domain,
            provider,
            template: DEFAULT_TEMPLATE.to_owned(),
            api_key: None,
            api_url: None,
            sandbox_url: None,
            request_timeout: Duration::from_secs(60),
            default_lifetime: Duration::from_secs(900),
            lifetime_margin: Duration::from_secs(600),
            max_retries: 3,
            limits: Limits::default(),
        }
    }

    /// The control plane's base URL, without a trailing slash.
    pub(crate) fn api_base(&self) -> String {
        match &self.api_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("https://api.{}", self.domain),
        }
    }

    /// The base URL of `port` of sandbox `id` (as the client names it), whose sandbox
    /// domain is `domain` (the create response's, else the configured one).
    pub(crate) fn sandbox_base(&self, port: u16, id: &str, domain: Option<&str>) -> String {
        let domain = domain.unwrap_or(&self.domain);
        match &self.sandbox_url {
            Some(t) => t
                .replace("{port}", &port.to_string())
                .replace("{sandbox_id}", id)
                .replace("{domain}", domain)
                .trim_end_matches('/')
                .to_owned(),
            None => format!("https://{port}-{id}.{domain}"),
        }
    }

    /// Checks what can be checked before the first request.
    pub fn validate(&self) -> Result<(), String> {
        if self.domain.trim().is_empty() || self.domain.contains(['/', ' ', ':']) {
            return Err(format!(
                "e2b domain {:?} is not a domain name (such as e2b.app or {NOVITA_DOMAIN})",
                self.domain
            ));
        }
        if self.template.trim().is_empty() {
            return Err("the e2b template name is empty".into());
        }
        if let Some(u) = &self.api_url {
            check_url("e2b api url", u)?;
        }
        if let Some(t) = &self.sandbox_url {
            if !t.contains("{sandbox_id}") || !t.contains("{port}") {
                return Err(format!(
                    "the e2b sandbox url {t:?} must name both {{port}} and {{sandbox_id}}, as in \
                     http://127.0.0.1:9000/{{port}}/{{sandbox_id}}"
                ));
            }
            check_url("e2b sandbox url", t)?;
        }
        Ok(())
    }
}

fn check_url(what: &str, u: &str) -> Result<(), String> {
    if u.starts_with("https://") || u.starts_with("http://") {
        Ok(())
    } else {
        Err(format!(
            "the {what} {u:?} must start with https:// or http://"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_follows_the_domain() {
        assert_eq!(Provider::from_domain("e2b.app"), Provider::E2b);
        assert_eq!(Provider::from_domain("e2b.example.com"), Provider::E2b);
        assert_eq!(Provider::from_domain(NOVITA_DOMAIN), Provider::Novita);
        assert_eq!(
            Provider::from_domain("eu-1.sandbox.novita.ai"),
            Provider::Novita
        );
        for legacy in NOVITA_LEGACY_DOMAINS {
            assert_eq!(Provider::from_domain(legacy), Provider::NovitaLegacy);
        }
        assert_eq!(
            Provider::from_domain("Sandbox.Novita.AI."),
            Provider::NovitaLegacy
        );
        // A look-alike is not Novita.
        assert_eq!(Provider::from_domain("evilnovita.ai"), Provider::E2b);
    }

    #[test]
    fn hosts_are_derived_from_the_port_the_id_and_the_domain() {
        let c = E2bConfig::new("e2b.app");
        assert_eq!(c.api_base(), "https://api.e2b.app");
        assert_eq!(
            c.sandbox_base(49983, "i1a2", None),
            "https://49983-i1a2.e2b.app"
        );
        // The create response's domain wins over the configured one.
        assert_eq!(
            c.sandbox_base(49999, "i1a2", Some("eu.e2b.dev")),
            "https://49999-i1a2.eu.e2b.dev"
        );
        let legacy = E2bConfig::new("sandbox.novita.ai");
        assert_eq!(
            legacy.sandbox_base(49983, "sbx1-c0ffee", None),
            "https://49983-sbx1-c0ffee.sandbox.novita.ai"
        );
    }

    #[test]
    fn overrides_substitute_every_placeholder() {
        let mut c = E2bConfig::new("e2b.app");
        c.api_url = Some("http://127.0.0.1:9000/api/".into());
        c.sandbox_url = Some("http://127.0.0.1:9000/{port}/{sandbox_id}/".into());
        assert_eq!(c.api_base(), "http://127.0.0.1:9000/api");
        assert_eq!(
            c.sandbox_base(49999, "sbx1", None),
            "http://127.0.0.1:9000/49999/sbx1"
        );
        c.sandbox_url = Some("https://{port}-{sandbox_id}.{domain}".into());
        assert_eq!(
            c.sandbox_base(49983, "x", Some("d.test")),
            "https://49983-x.d.test"
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let mut c = E2bConfig::new("https://e2b.app");
        assert!(c.validate().unwrap_err().contains("not a domain name"));
        c = E2bConfig::new("e2b.app");
        c.sandbox_url = Some("http://127.0.0.1:9000/{port}".into());
        assert!(c.validate().unwrap_err().contains("{sandbox_id}"));
        c.sandbox_url = None;
        c.api_url = Some("ftp://x".into());
        assert!(c.validate().unwrap_err().contains("https://"));
    }

    #[test]
    fn debug_hides_the_key() {
        let mut c = E2bConfig::new("e2b.app");
        c.api_key = Some(Credential::new("e2b_secret"));
        assert!(!format!("{c:?}").contains("e2b_secret"));
    }
}
