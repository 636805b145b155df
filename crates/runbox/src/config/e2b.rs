//! The e2b backend's settings (`serve` and `doctor`), and its checks: what it needs (a key,
//! unless each caller sends their own) and what only it takes (the `--e2b-*` settings).

use anyhow::bail;
use clap::Args;

use super::{BackendKind, Env};

/// The e2b backend's settings, as flags. `Debug` never shows the key.
#[derive(Default, Args)]
pub(crate) struct E2bArgs {
    /// The e2b backend's provider domain: e2b.app (E2B) [default], a Novita domain such as
    /// us-phx-1.sandbox.novita.ai (legacy sandbox.novita.ai too), or a self-hosted one.
    #[arg(long, env = "RUNBOX_E2B_DOMAIN", value_name = "DOMAIN")]
    pub(crate) e2b_domain: Option<String>,

    /// The template cloud sandboxes are made from [default: code-interpreter-v1].
    #[arg(long, env = "RUNBOX_E2B_TEMPLATE", value_name = "NAME")]
    pub(crate) e2b_template: Option<String>,

    /// The operator's provider API key [default: $E2B_API_KEY, or $NOVITA_API_KEY for a
    /// Novita domain]. Not with --auth passthrough, where each caller's key is used.
    #[arg(
        long,
        env = "RUNBOX_E2B_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub(crate) e2b_api_key: Option<String>,

    /// The provider's control-plane base URL, instead of https://api.DOMAIN (self-hosted
    /// gateways, tests).
    #[arg(long, env = "RUNBOX_E2B_API_URL", value_name = "URL")]
    pub(crate) e2b_api_url: Option<String>,

    /// The base URL of a port of a cloud sandbox, instead of https://PORT-ID.DOMAIN, with
    /// {port}, {sandbox_id} and {domain} substituted, e.g.
    /// http://127.0.0.1:9000/{port}/{sandbox_id}.
    #[arg(long, env = "RUNBOX_E2B_SANDBOX_URL", value_name = "TEMPLATE")]
    pub(crate) e2b_sandbox_url: Option<String>,
}

impl std::fmt::Debug for E2bArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bArgs")
            .field("e2b_domain", &self.e2b_domain)
            .field("e2b_template", &self.e2b_template)
            .field("e2b_api_key", &self.e2b_api_key.as_ref().map(|_| "***"))
            .field("e2b_api_url", &self.e2b_api_url)
            .field("e2b_sandbox_url", &self.e2b_sandbox_url)
            .finish()
    }
}

impl E2bArgs {
    /// The flags set, each with its name.
    fn given(&self) -> [(&'static str, bool); 5] {
        [
            ("--e2b-domain", self.e2b_domain.is_some()),
            ("--e2b-template", self.e2b_template.is_some()),
            ("--e2b-api-key", self.e2b_api_key.is_some()),
            ("--e2b-api-url", self.e2b_api_url.is_some()),
            ("--e2b-sandbox-url", self.e2b_sandbox_url.is_some()),
        ]
    }

    /// The settings for `backend`: `None` for another backend, which takes none of them.
    pub(crate) fn resolve(
        self,
        backend: BackendKind,
        passthrough: bool,
        env: Env<'_>,
    ) -> anyhow::Result<Option<E2bSettings>> {
        match backend {
            BackendKind::E2b => self.settings(passthrough, env).map(Some),
            BackendKind::Local => {
                if let Some((flag, _)) = self.given().iter().find(|(_, set)| *set) {
                    bail!("{flag} applies to --backend e2b only");
                }
                Ok(None)
            }
        }
    }

    /// The settings, with the key from the provider's variable (read through `env`) unless
    /// given, or none at all with `passthrough`; checked.
    pub(crate) fn settings(self, passthrough: bool, env: Env<'_>) -> anyhow::Result<E2bSettings> {
        let domain = self
            .e2b_domain
            .unwrap_or_else(|| runbox_e2b::E2B_DOMAIN.to_owned());
        let provider = runbox_e2b::Provider::from_domain(&domain);
        let api_key = if passthrough {
            if self.e2b_api_key.is_some() {
                bail!(
                    "--auth passthrough keeps no key of its own: each caller's bearer value is \
                     their key; leave out --e2b-api-key"
                );
            }
            None
        } else {
            let from_env = provider
                .key_variables()
                .iter()
                .find_map(|v| env(v).ok().filter(|k| !k.trim().is_empty()));
            match self.e2b_api_key.or(from_env) {
                Some(k) => Some(k.trim().to_owned()),
                None => bail!(
                    "the e2b backend needs an API key for {}: pass --e2b-api-key or set {}, or \
                     use --auth passthrough so that each caller sends their own",
                    provider.name(),
                    provider.key_variables().join(" or ")
                ),
            }
        };
        let settings = E2bSettings {
            domain,
            template: self
                .e2b_template
                .unwrap_or_else(|| runbox_e2b::DEFAULT_TEMPLATE.to_owned()),
            api_key,
            api_url: self.e2b_api_url,
            sandbox_url: self.e2b_sandbox_url,
        };
        settings.config().validate().map_err(anyhow::Error::msg)?;
        Ok(settings)
    }
}

/// The cloud backend's settings.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct E2bSettings {
    pub(crate) domain: String,
    pub(crate) template: String,
    /// The operator's key; `None` with passthrough.
    pub(crate) api_key: Option<String>,
    pub(crate) api_url: Option<String>,
    pub(crate) sandbox_url: Option<String>,
}

impl E2bSettings {
    /// The backend's configuration for these settings (the rest at their defaults).
    pub(crate) fn config(&self) -> runbox_e2b::E2bConfig {
        let mut c = runbox_e2b::E2bConfig::new(&self.domain);
        c.template.clone_from(&self.template);
        c.api_key = self.api_key.as_deref().map(runbox_core::Credential::new);
        c.api_url.clone_from(&self.api_url);
        c.sandbox_url.clone_from(&self.sandbox_url);
        c
    }
}

impl std::fmt::Debug for E2bSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bSettings")
            .field("domain", &self.domain)
            .field("template", &self.template)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("api_url", &self.api_url)
            .field("sandbox_url", &self.sandbox_url)
            .finish()
    }
}
