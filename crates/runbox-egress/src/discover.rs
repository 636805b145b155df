//! The package-index hosts the host's own pip and npm use, found at run time, so an operator
//! can let sandboxes install packages from exactly the indexes (mirrors included) this machine
//! is set up for. No index host is written in this crate: pip's compiled-in defaults come from
//! pip itself, npm's registry from npm.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use http::Uri;
use tokio::process::Command;

use crate::HostPattern;

/// Asks pip for its compiled-in index and file host (used when no index URL is configured).
const PIP_DEFAULTS: &str = "from pip._internal.models.index import PyPI\n\
                            print(PyPI.simple_url)\n\
                            print(PyPI.file_storage_domain)";

/// The programs discovery runs. The server passes the interpreters it resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexCommands {
    /// The Python interpreter whose pip is asked (`python3` by default, found on `PATH`).
    pub python: PathBuf,
    /// The npm program (`npm` by default, found on `PATH`).
    pub npm: PathBuf,
    /// How long each command may run.
    pub timeout: Duration,
}

impl Default for IndexCommands {
    fn default() -> Self {
        Self {
            python: PathBuf::from("python3"),
            npm: PathBuf::from("npm"),
            timeout: Duration::from_secs(30),
        }
    }
}

/// Index hosts found, as allowlist entries (`host`, or `host:port` for a non-default port).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexHosts {
    /// pip's index, extra index, find-links and trusted hosts, or its defaults.
    pub pip: Vec<String>,
    /// npm's registry.
    pub npm: Vec<String>,
    /// Variables that point a sandbox's pip and npm at the same indexes as the host's
    /// (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, `PIP_TRUSTED_HOST`, `npm_config_registry`).
    /// A URL carrying credentials is left out: a sandbox must never see the operator's.
    pub env: Vec<(String, String)>,
}

impl IndexHosts {
    /// Every host, pip's then npm's, without duplicates.
    pub fn all(&self) -> Vec<String> {
        let mut all = Vec::new();
        for host in self.pip.iter().chain(&self.npm) {
            push_unique(&mut all, host.clone());
        }
        all
    }
}

/// pip settings that name hosts, from `pip config list` or `PIP_*` variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipSettings {
    /// `index-url` values.
    pub index_urls: Vec<String>,
    /// `extra-index-url` values.
    pub extra_index_urls: Vec<String>,
    /// `find-links` values (paths as well as URLs).
    pub find_links: Vec<String>,
    /// `trusted-host` values (`host` or `host:port`).
    pub trusted_hosts: Vec<String>,
}

impl PipSettings {
    /// The settings in `PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, `PIP_FIND_LINKS` and
    /// `PIP_TRUSTED_HOST` (whitespace-separated lists, as pip reads them).
    pub fn from_env() -> Self {
        let mut settings = Self::default();
        for (var, key) in [
            ("PIP_INDEX_URL", "index-url"),
            ("PIP_EXTRA_INDEX_URL", "extra-index-url"),
            ("PIP_FIND_LINKS", "find-links"),
            ("PIP_TRUSTED_HOST", "trusted-host"),
        ] {
            if let Ok(value) = std::env::var(var) {
                settings.add(key, &value);
            }
        }
        settings
    }

    /// Parses `pip config list` output: lines `section.key='value'`, where a multi-line
    /// value shows its line breaks as `\n`. Other keys and odd lines are ignored.
    pub fn parse_config_list(text: &str) -> Self {
        let mut settings = Self::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let name = key.rsplit_once('.').map_or(key, |(_, name)| name);
            let value = value.trim();
            let value = ['\'', '"']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            settings.add(
                &name.trim().to_ascii_lowercase().replace('_', "-"),
                &value.replace("\\n", "\n"),
            );
        }
        settings
    }

    fn add(&mut self, key: &str, value: &str) {
        let list = match key {
            "index-url" => &mut self.index_urls,
            "extra-index-url" => &mut self.extra_index_urls,
            "find-links" => &mut self.find_links,
            "trusted-host" => &mut self.trusted_hosts,
            _ => return,
        };
        for item in value.split_whitespace() {
            push_unique(list, item.to_owned());
        }
    }

    fn extend(&mut self, other: Self) {
        for (own, theirs) in [
            (&mut self.index_urls, other.index_urls),
            (&mut self.extra_index_urls, other.extra_index_urls),
            (&mut self.find_links, other.find_links),
            (&mut self.trusted_hosts, other.trusted_hosts),
        ] {
            for item in theirs {
                push_unique(own, item);
            }
        }
    }

    /// The hosts these settings name, as allowlist entries. Paths (`find-links` may be one)
    /// and anything that is not a valid host are skipped.
    pub fn hosts(&self) -> Vec<String> {
        let mut hosts = Vec::new();
        let urls = self
            .index_urls
            .iter()
            .chain(&self.extra_index_urls)
            .chain(&self.find_links);
        for host in urls.filter_map(|url| url_host(url)) {
            push_unique(&mut hosts, host);
        }
        for entry in &self.trusted_hosts {
            if let Ok(pattern) = HostPattern::parse(entry)
                && !pattern.is_wildcard()
            {
                push_unique(&mut hosts, pattern.to_string());
            }
        }
        hosts
    }
}

/// The allowlist entry for an `http` or `https` URL's host: `host`, or `host:port` when the
/// URL names a port other than its scheme's default. `None` for anything else.
pub fn url_host(url: &str) -> Option<String> {
    let uri = url.trim().parse::<Uri>().ok()?;
    let default_port = match uri.scheme_str()?.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = uri.authority()?;
    let entry = match authority.port_u16() {
        Some(port) if port != default_port => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    let pattern = HostPattern::parse(&entry).ok()?;
    (!pattern.is_wildcard()).then(|| pattern.to_string())
}

/// Finds the package-index hosts of this machine's pip and npm. A command that is missing,
/// fails or times out is skipped (logged at debug level); this never fails.
pub async fn discover_index_hosts(commands: &IndexCommands) -> IndexHosts {
    let ((pip, settings), (npm, registry)) = tokio::join!(pip_hosts(commands), npm_hosts(commands));
    let mut env = Vec::new();
    let shareable = |url: &&String| !has_credentials(url);
    if let Some(index) = settings.index_urls.iter().find(shareable) {
        env.push(("PIP_INDEX_URL".to_owned(), index.clone()));
    }
    let extra: Vec<&str> = settings
        .extra_index_urls
        .iter()
        .filter(shareable)
        .map(String::as_str)
        .collect();
    if !extra.is_empty() {
        env.push(("PIP_EXTRA_INDEX_URL".to_owned(), extra.join(" ")));
    }
    if !settings.trusted_hosts.is_empty() {
        env.push((
            "PIP_TRUSTED_HOST".to_owned(),
            settings.trusted_hosts.join(" "),
        ));
    }
    if let Some(registry) = registry.filter(|r| !has_credentials(r)) {
        env.push(("npm_config_registry".to_owned(), registry));
    }
    IndexHosts { pip, npm, env }
}

/// Whether a URL carries a user name or password (`scheme://user:pass@host/`).
fn has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#'])
        .next()
        .is_some_and(|authority| authority.contains('@'))
}

/// Every host [`discover_index_hosts`] finds, as one list.
pub async fn discover_package_hosts(commands: &IndexCommands) -> Vec<String> {
    discover_index_hosts(commands).await.all()
}

async fn pip_hosts(commands: &IndexCommands) -> (Vec<String>, PipSettings) {
    let mut settings = PipSettings::from_env();
    let listed = run(commands, &commands.python, &["-m", "pip", "config", "list"]).await;
    if let Some(text) = listed {
        settings.extend(PipSettings::parse_config_list(&text));
    }
    let mut hosts = settings.hosts();
    if settings.index_urls.is_empty()
        && let Some(text) = run(commands, &commands.python, &["-c", PIP_DEFAULTS]).await
    {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let index = lines.next().and_then(url_host);
        let files = lines
            .next()
            .and_then(|h| HostPattern::parse(h).ok())
            .map(|p| p.to_string());
        for host in index.into_iter().chain(files) {
            push_unique(&mut hosts, host);
        }
    }
    (hosts, settings)
}

/// npm's registry host, and its URL.
async fn npm_hosts(commands: &IndexCommands) -> (Vec<String>, Option<String>) {
    let registry = run(commands, &commands.npm, &["config", "get", "registry"])
        .await
        .and_then(|text| {
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        });
    let host = registry.as_deref().and_then(url_host);
    (
        host.into_iter().collect(),
        registry.filter(|r| url_host(r).is_some()),
    )
}

/// Runs a command with the server's environment; its stdout, or `None` (logged). Python runs
/// in `/`, so `-m` and `-c` never import a module from the server's working directory.
async fn run(commands: &IndexCommands, program: &Path, args: &[&str]) -> Option<String> {
    let in_root = program == commands.python;
    // A relative path with a directory in it would be looked up from `/`: anchor it here.
    let program = if in_root && program.is_relative() && program.components().count() > 1 {
        std::path::absolute(program).unwrap_or_else(|_| program.to_path_buf())
    } else {
        program.to_path_buf()
    };
    let mut command = Command::new(&program);
    if in_root {
        command.current_dir("/");
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let program = program.display();
    match tokio::time::timeout(commands.timeout, command.output()).await {
        Err(_) => {
            tracing::debug!(
                target: "runbox_egress",
                %program, ?args, "index discovery: timed out"
            );
            None
        }
        Ok(Err(error)) => {
            tracing::debug!(
                target: "runbox_egress",
                %program, ?args, %error, "index discovery: cannot run"
            );
            None
        }
        Ok(Ok(output)) if !output.status.success() => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stderr = stderr.lines().last().unwrap_or("");
            tracing::debug!(
                target: "runbox_egress",
                %program, ?args, status = %output.status, stderr, "index discovery: command failed"
            );
            None
        }
        Ok(Ok(output)) => Some(String::from_utf8_lossy(&output.stdout).into_owned()),
    }
}

fn push_unique(list: &mut Vec<String>, item: String) {
    if !list.contains(&item) {
        list.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pip_config_list_output() {
        let text = "\
:env:.default-timeout='180'
:env:.index-url='https://mirror.example.test/simple'
global.extra-index-url='https://a.example.test/simple\\nhttps://u:pw@B.example.test:8443/simple'
install.trusted-host='c.example.test d.example.test:8080'
global.find_links='/opt/wheels http://wheels.example.test/'
global.cert='/etc/ssl/certs/ca-certificates.crt'
not a setting line
";
        let settings = PipSettings::parse_config_list(text);
        assert_eq!(settings.index_urls, ["https://mirror.example.test/simple"]);
        assert_eq!(
            settings.extra_index_urls,
            [
                "https://a.example.test/simple",
                "https://u:pw@B.example.test:8443/simple"
            ]
        );
        assert_eq!(
            settings.trusted_hosts,
            ["c.example.test", "d.example.test:8080"]
        );
        assert_eq!(
            settings.find_links,
            ["/opt/wheels", "http://wheels.example.test/"]
        );
        assert_eq!(
            settings.hosts(),
            [
                "mirror.example.test",
                "a.example.test",
                "b.example.test:8443",
                "wheels.example.test",
                "c.example.test",
                "d.example.test:8080",
            ]
        );
    }

    #[test]
    fn urls_with_credentials_are_never_shared() {
        assert!(has_credentials("https://user:secret@mirror.example/simple"));
        assert!(has_credentials("https://token@mirror.example"));
        assert!(!has_credentials("https://mirror.example/simple?x=a@b"));
        assert!(!has_credentials("https://mirror.example:8443/pypi/simple"));
    }

    #[test]
    fn url_hosts_keep_only_non_default_ports() {
        assert_eq!(
            url_host("https://idx.example.test/simple/").as_deref(),
            Some("idx.example.test")
        );
        assert_eq!(
            url_host("https://idx.example.test:443/").as_deref(),
            Some("idx.example.test")
        );
        assert_eq!(
            url_host("http://idx.example.test:8080").as_deref(),
            Some("idx.example.test:8080")
        );
        assert_eq!(
            url_host("http://[fd00::1]:3141/root").as_deref(),
            Some("[fd00::1]:3141")
        );
        assert_eq!(
            url_host("HTTPS://IDX.example.test./").as_deref(),
            Some("idx.example.test")
        );
        for not_a_url in [
            "/opt/wheels",
            "file:///opt/wheels",
            "undefined",
            "",
            "https://",
        ] {
            assert_eq!(url_host(not_a_url), None, "{not_a_url}");
        }
    }

    #[test]
    fn all_dedupes_across_tools() {
        let hosts = IndexHosts {
            pip: vec!["a.example.test".into(), "b.example.test".into()],
            npm: vec!["b.example.test".into(), "c.example.test".into()],
            env: Vec::new(),
        };
        assert_eq!(
            hosts.all(),
            ["a.example.test", "b.example.test", "c.example.test"]
        );
    }

    #[tokio::test]
    async fn missing_commands_are_skipped() {
        let commands = IndexCommands {
            python: PathBuf::from("/nonexistent/python3"),
            npm: PathBuf::from("/nonexistent/npm"),
            timeout: Duration::from_secs(5),
        };
        let hosts = discover_index_hosts(&commands).await;
        assert!(hosts.npm.is_empty());
        // pip's list holds only what PIP_* variables name, if any.
        assert_eq!(hosts.pip, PipSettings::from_env().hosts());
    }
}
