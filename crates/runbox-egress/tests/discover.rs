//! Package-index discovery against this machine's real pip and npm (both installed here and
//! in CI). No host is named: the test only checks that each tool gives at least one entry and
//! that every entry is a well-formed allowlist entry for an exact host.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use runbox_egress::{HostPattern, IndexCommands, discover_index_hosts};

#[tokio::test]
async fn finds_this_machines_pip_and_npm_index_hosts() {
    let hosts = discover_index_hosts(&IndexCommands::default()).await;
    assert!(!hosts.pip.is_empty(), "no pip index host found: {hosts:?}");
    assert!(
        !hosts.npm.is_empty(),
        "no npm registry host found: {hosts:?}"
    );
    for entry in hosts.all() {
        let pattern = HostPattern::parse(&entry).unwrap_or_else(|e| panic!("{entry}: {e}"));
        assert!(!pattern.is_wildcard(), "{entry}");
        assert_eq!(pattern.to_string(), entry, "entries are canonical");
        assert!(!entry.contains(['/', '@', ' ']), "{entry}");
    }
    // npm inside a sandbox is pointed at the host's registry, whose host is allowed.
    let registry = hosts
        .env
        .iter()
        .find(|(k, _)| k == "npm_config_registry")
        .map(|(_, v)| v.clone())
        .expect("the npm registry is passed on");
    assert!(
        hosts.npm.iter().any(|h| registry.contains(h.as_str())),
        "{registry} vs {:?}",
        hosts.npm
    );
}
