//! The control plane (REST, `api.{domain}`, `X-API-KEY`): create, get, kill, set the
//! timeout, pause, connect (resume). v1 paths, which E2B and Novita both serve.

use std::collections::BTreeMap;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use runbox_core::Credential;
use serde::{Deserialize, Serialize};

use crate::config::{E2bConfig, Provider};
use crate::http::{Http, ProviderError, Retry, Surface};

/// Characters kept as they are in a path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What runbox knows of one of its cloud sandboxes: how to reach it and with what.
#[derive(Clone)]
pub(crate) struct Remote {
    /// The id in paths and host names (on Novita's legacy domains `{sandboxID}-{clientID}`).
    pub(crate) id: String,
    /// The key it was made with; every control-plane call about it uses the same.
    pub(crate) key: Credential,
    /// envd's access token (`X-Access-Token`), when the sandbox is secured.
    pub(crate) envd_token: Option<String>,
    /// The token for ports other than envd's when public traffic is off.
    pub(crate) traffic_token: Option<String>,
    /// The sandbox domain the provider named, when not the configured one.
    pub(crate) domain: Option<String>,
    /// The template it was made from.
    pub(crate) template: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("id", &self.id)
            .field("domain", &self.domain)
            .field("template", &self.template)
            .finish_non_exhaustive()
    }
}

/// The create and connect answer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxResponse {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID", default)]
    client_id: Option<String>,
    #[serde(rename = "templateID", default)]
    template_id: Option<String>,
    #[serde(default)]
    envd_access_token: Option<String>,
    #[serde(default)]
    traffic_access_token: Option<String>,
    #[serde(default)]
    domain: Option<String>,
}

/// `GET /sandboxes/{id}`, the fields runbox uses.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxDetail {
    #[serde(default)]
    pub(crate) state: Option<String>,
    #[serde(default)]
    pub(crate) cpu_count: Option<f64>,
    #[serde(rename = "memoryMB", default)]
    pub(crate) memory_mb: Option<u64>,
    #[serde(rename = "diskSizeMB", default)]
    pub(crate) disk_size_mb: Option<u64>,
}

impl SandboxDetail {
    /// `limits` with the memory, CPUs and disk the provider gave the sandbox.
    pub(crate) fn apply(&self, limits: &mut runbox_core::Limits) {
        if let Some(mb) = self.memory_mb.filter(|m| *m > 0) {
            limits.memory_mb = mb;
        }
        if let Some(cpus) = self.cpu_count.filter(|c| *c > 0.0) {
            limits.cpus = cpus;
        }
        if let Some(mb) = self.disk_size_mb.filter(|m| *m > 0) {
            limits.workspace_mb = mb;
        }
    }

    /// The limits the provider's VM enforces, as far as it says: its memory and its CPUs,
    /// each for the whole sandbox.
    pub(crate) fn enforced(&self) -> runbox_core::EnforcedLimits {
        runbox_core::EnforcedLimits {
            memory: self
                .memory_mb
                .filter(|m| *m > 0)
                .map(|mb| runbox_core::Enforced {
                    value: mb.saturating_mul(1 << 20),
                    per: runbox_core::Scope::Sandbox,
                    by: "the provider's virtual machine".to_owned(),
                }),
            processes: None,
            cpus: self.cpu_count.filter(|c| *c > 0.0),
        }
    }
}

/// The create body, modern E2B and Novita.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox<'a> {
    #[serde(rename = "templateID")]
    template_id: &'a str,
    timeout: u64,
    metadata: &'a BTreeMap<String, String>,
    env_vars: &'a BTreeMap<String, String>,
    /// snake_case on the wire (the generated model's name).
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    auto_pause: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secure: Option<bool>,
}

/// The create body of Novita's legacy domains: camelCase throughout, unsecured.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewSandboxLegacy<'a> {
    #[serde(rename = "templateID")]
    template_id: &'a str,
    timeout: u64,
    metadata: &'a BTreeMap<String, String>,
    env_vars: &'a BTreeMap<String, String>,
    allow_internet_access: bool,
    auto_pause: bool,
    secure: bool,
}

/// What a sandbox is made with.
pub(crate) struct NewSandboxSpec<'a> {
    pub(crate) key: Credential,
    pub(crate) lifetime: Duration,
    pub(crate) metadata: &'a BTreeMap<String, String>,
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) internet: bool,
}

/// The control plane of one provider.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub(crate) http: Http,
    base: String,
    provider: Provider,
    template: String,
    timeout: Duration,
}

/// Whole seconds, at least one.
fn seconds(d: Duration) -> u64 {
    d.as_secs().max(1)
}

impl Api {
    pub(crate) fn new(http: Http, config: &E2bConfig) -> Self {
        Self {
            http,
            base: config.api_base(),
            provider: config.provider,
            template: config.template.clone(),
            timeout: config.request_timeout,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn sandbox_path(id: &str, rest: &str) -> String {
        format!("/sandboxes/{}{rest}", utf8_percent_encode(id, SEGMENT))
    }

    fn request(&self, method: Method, path: &str, key: &Credential) -> reqwest::RequestBuilder {
        self.http
            .client
            .request(method, self.url(path))
            .timeout(self.timeout)
            .header("X-API-KEY", key.expose())
    }

    /// Creates a sandbox from the configured template. Retried only after refusals that
    /// mean it was not acted on (429, 503): a retried create could make two.
    pub(crate) async fn create(&self, spec: NewSandboxSpec<'_>) -> Result<Remote, ProviderError> {
        let timeout = seconds(spec.lifetime);
        let body = match self.provider {
            Provider::NovitaLegacy => serde_json::to_vec(&NewSandboxLegacy {
                template_id: &self.template,
                timeout,
                metadata: spec.metadata,
                env_vars: spec.env,
                allow_internet_access: spec.internet,
                auto_pause: false,
                secure: false,
            }),
            Provider::Novita => serde_json::to_vec(&NewSandbox {
                template_id: &self.template,
                timeout,
                metadata: spec.metadata,
                env_vars: spec.env,
                allow_internet_access: spec.internet,
                auto_pause: Some(false),
                secure: Some(true),
            }),
            Provider::E2b => serde_json::to_vec(&NewSandbox {
                template_id: &self.template,
                timeout,
                metadata: spec.metadata,
                env_vars: spec.env,
                allow_internet_access: spec.internet,
                auto_pause: None,
                secure: None,
            }),
        }
        .map_err(|e| {
            self.http
                .protocol(Surface::Api, format!("create body: {e}"))
        })?;
        let response = self
            .http
            .send(Surface::Api, Retry::Refused, || {
                self.request(Method::POST, "/sandboxes", &spec.key)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
            })
            .await?;
        let created: SandboxResponse = self.json(response).await?;
        Ok(self.remote(created, spec.key, None))
    }

    fn remote(&self, r: SandboxResponse, key: Credential, id: Option<&str>) -> Remote {
        let id = match id {
            // Connect answers with the provider's own id; keep the one runbox addresses.
            Some(id) => id.to_owned(),
            None => match (&self.provider, r.client_id.as_deref()) {
                (Provider::NovitaLegacy, Some(c)) if !c.is_empty() => {
                    format!("{}-{c}", r.sandbox_id)
                }
                _ => r.sandbox_id,
            },
        };
        Remote {
            id,
            key,
            envd_token: r.envd_access_token.filter(|t| !t.is_empty()),
            traffic_token: r.traffic_access_token.filter(|t| !t.is_empty()),
            domain: r.domain.filter(|d| !d.is_empty()),
            template: r.template_id.unwrap_or_else(|| self.template.clone()),
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, ProviderError> {
        let bytes = self.http.body(Surface::Api, response, 4 << 20).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            self.http.protocol(
                Surface::Api,
                format!("sent an answer runbox cannot read: {e}"),
            )
        })
    }

    /// The sandbox's details.
    pub(crate) async fn get(&self, remote: &Remote) -> Result<SandboxDetail, ProviderError> {
        let path = Self::sandbox_path(&remote.id, "");
        let response = self
            .http
            .send(Surface::Api, Retry::Idempotent, || {
                self.request(Method::GET, &path, &remote.key)
            })
            .await?;
        self.json(response).await
    }

    /// Kills the sandbox; `false` when it was already gone.
    pub(crate) async fn kill(&self, remote: &Remote) -> Result<bool, ProviderError> {
        let path = Self::sandbox_path(&remote.id, "");
        match self
            .http
            .send(Surface::Api, Retry::Idempotent, || {
                self.request(Method::DELETE, &path, &remote.key)
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets the sandbox to end `lifetime` from now unless told again.
    pub(crate) async fn set_timeout(
        &self,
        remote: &Remote,
        lifetime: Duration,
    ) -> Result<(), ProviderError> {
        let path = Self::sandbox_path(&remote.id, "/timeout");
        let body = serde_json::json!({ "timeout": seconds(lifetime) }).to_string();
        self.http
            .send(Surface::Api, Retry::Idempotent, || {
                self.request(Method::POST, &path, &remote.key)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
            })
            .await?;
        Ok(())
    }

    /// Pauses the sandbox (its memory and files kept); already paused is fine.
    pub(crate) async fn pause(&self, remote: &Remote) -> Result<(), ProviderError> {
        let path = Self::sandbox_path(&remote.id, "/pause");
        let r = self
            .http
            .send(Surface::Api, Retry::Idempotent, || {
                let r = self.request(Method::POST, &path, &remote.key);
                match self.provider {
                    Provider::NovitaLegacy => r
                        .header("Content-Type", "application/json")
                        .body(r#"{"sync":true}"#),
                    Provider::E2b | Provider::Novita => r,
                }
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Connects to the sandbox, resuming it if paused, to end `lifetime` from now; the
    /// answer may carry new tokens and a new domain.
    pub(crate) async fn connect(
        &self,
        remote: &Remote,
        lifetime: Duration,
    ) -> Result<Remote, ProviderError> {
        let path = Self::sandbox_path(&remote.id, "/connect");
        let body = match self.provider {
            Provider::NovitaLegacy => {
                serde_json::json!({ "timeout": seconds(lifetime), "autoPause": false })
            }
            Provider::E2b | Provider::Novita => serde_json::json!({ "timeout": seconds(lifetime) }),
        }
        .to_string();
        let response = self
            .http
            .send(Surface::Api, Retry::Idempotent, || {
                self.request(Method::POST, &path, &remote.key)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
            })
            .await?;
        let r: SandboxResponse = self.json(response).await?;
        let mut updated = self.remote(r, remote.key.clone(), Some(&remote.id));
        // A connect that names no token keeps the one the sandbox had.
        if updated.envd_token.is_none() {
            updated.envd_token.clone_from(&remote.envd_token);
        }
        Ok(updated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_enforces_what_its_provider_says_and_nothing_more() {
        let detail: SandboxDetail =
            serde_json::from_value(serde_json::json!({"cpuCount": 2, "memoryMB": 512})).unwrap();
        let e = detail.enforced();
        assert_eq!(e.sandbox_memory_bytes(), Some(512 << 20));
        assert_eq!(e.cpus, Some(2.0));
        assert_eq!(e.processes, None);
        let silent: SandboxDetail = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(silent.enforced(), runbox_core::EnforcedLimits::default());
    }

    #[test]
    fn ids_are_one_encoded_path_segment() {
        assert_eq!(Api::sandbox_path("sbx1", "/pause"), "/sandboxes/sbx1/pause");
        assert_eq!(
            Api::sandbox_path("a/../b c", ""),
            "/sandboxes/a%2F..%2Fb%20c"
        );
    }

    #[test]
    fn create_bodies_follow_each_provider() {
        let m = BTreeMap::from([("owner".to_owned(), "mcp".to_owned())]);
        let e = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
        let modern = serde_json::to_value(NewSandbox {
            template_id: "code-interpreter-v1",
            timeout: 600,
            metadata: &m,
            env_vars: &e,
            allow_internet_access: true,
            auto_pause: Some(false),
            secure: Some(true),
        })
        .unwrap();
        // The body the Novita SDK 2.1.1 was recorded sending.
        assert_eq!(
            modern,
            serde_json::json!({"templateID":"code-interpreter-v1","allow_internet_access":true,
                "autoPause":false,"envVars":{"FOO":"bar"},"metadata":{"owner":"mcp"},
                "secure":true,"timeout":600})
        );
        let legacy = serde_json::to_value(NewSandboxLegacy {
            template_id: "t",
            timeout: 1,
            metadata: &m,
            env_vars: &e,
            allow_internet_access: false,
            auto_pause: false,
            secure: false,
        })
        .unwrap();
        assert_eq!(legacy["allowInternetAccess"], false);
        assert_eq!(legacy["secure"], false);
        assert!(legacy.get("allow_internet_access").is_none());
    }
}
