//! The local backend's own settings of `runbox serve` (the engine's, shared with `run` and
//! `doctor`, are [`EngineArgs`](crate::cli::EngineArgs)): the data directory and the egress
//! proxy's hosts and addresses, and their checks. Another backend refuses them.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use super::BackendKind;

/// Settings of the local backend's sandboxes.
#[derive(Debug, Default, Args)]
pub(crate) struct LocalArgs {
    /// A directory of data files for every sandbox: mounted read-only at /data, and each
    /// file listed as an MCP resource data://<name without extension>.
    #[arg(long, env = "RUNBOX_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,

    /// A host sandboxes created with network "allowlist" may reach through the egress proxy
    /// (`name`, `*.suffix`, optional `:port`; repeatable). Without it: the package indexes
    /// this machine's pip and npm use. `none`: no host, so no sandbox gets a network.
    #[arg(
        long,
        env = "RUNBOX_ALLOW_HOST",
        value_name = "HOST",
        value_delimiter = ','
    )]
    pub(crate) allow_host: Vec<String>,

    /// An address range the egress proxy may connect to although it is private (a package
    /// mirror on the local network, say); loopback and link-local stay refused unless named.
    #[arg(
        long,
        env = "RUNBOX_ALLOW_ADDRESS",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub(crate) allow_address: Vec<String>,
}

/// The local backend's settings, checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct LocalSettings {
    /// The operator's data directory, absolute.
    pub(crate) data_dir: Option<PathBuf>,
    /// Hosts the egress proxy lets through; `None`: those of the host's pip and npm.
    pub(crate) egress_hosts: Option<runbox_egress::Allowlist>,
    /// Private address ranges the egress proxy may connect to.
    pub(crate) egress_addresses: Vec<runbox_egress::IpNet>,
}

impl LocalArgs {
    /// The settings, checked; another backend than the local one refuses any of them.
    pub(crate) fn resolve(self, backend: BackendKind) -> anyhow::Result<LocalSettings> {
        let data_dir = match self.data_dir {
            Some(d) => {
                let abs = std::fs::canonicalize(&d)
                    .with_context(|| format!("data_dir {}", d.display()))?;
                if !abs.is_dir() {
                    bail!("data_dir {} is not a directory", d.display());
                }
                Some(abs)
            }
            None => None,
        };
        let hosts = self.allow_host;
        let egress_hosts = match hosts.as_slice() {
            [] => None,
            [only] if only == "none" => Some(runbox_egress::Allowlist::default()),
            _ => Some(runbox_egress::Allowlist::parse(&hosts).context("allow-host")?),
        };
        let egress_addresses = self
            .allow_address
            .iter()
            .map(|a| runbox_egress::parse_address_range(a))
            .collect::<Result<Vec<_>, _>>()
            .context("allow-address")?;
        if backend != BackendKind::Local {
            if data_dir.is_some() {
                bail!(
                    "--data-dir mounts a directory of this machine into local sandboxes; the \
                     e2b backend cannot (upload the files with write_file instead)"
                );
            }
            if egress_hosts.is_some() || !egress_addresses.is_empty() {
                bail!(
                    "--allow-host and --allow-address configure the local egress proxy; cloud \
                     sandboxes reach the internet through their provider (create them with \
                     network \"allowlist\"), or not at all"
                );
            }
        }
        Ok(LocalSettings {
            data_dir,
            egress_hosts,
            egress_addresses,
        })
    }
}
