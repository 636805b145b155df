//! The Landlock layer: an allow list of paths, ports and scopes enforced by the kernel on
//! every process of the sandbox, independent of mounts and uids.
//!
//! Applied best-effort: on a kernel with an older ABI the features it lacks are dropped and
//! the report says so (`partially enforced`, `landlock_tcp: false`, ...); on a kernel without
//! Landlock the layer is reported as not enforced.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use crate::policy::LandlockPolicy;
use crate::report::LayerReport;

fn abi_from(v: u32) -> ABI {
    ABI::from(i32::try_from(v).unwrap_or(0))
}

/// Restricts the calling process (and everything it starts) to `policy`, recording what
/// was enforced in `report`.
pub(crate) fn apply(policy: &LandlockPolicy, report: &mut LayerReport) -> Result<(), String> {
    let version = crate::sys::landlock_abi_version();
    report.landlock_abi = version;
    if version == 0 {
        report.landlock_status = "not enforced (the kernel has no Landlock)".into();
        return Ok(());
    }
    let abi = abi_from(version);
    let all = AccessFs::from_all(abi);
    let read_exec = AccessFs::from_read(abi) | AccessFs::Execute;
    let devices = AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::IoctlDev;
    let err = |e: landlock::RulesetError| e.to_string();

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(err)?;
    let tcp = version >= 4;
    if tcp {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(err)?;
    }
    let scopes = version >= 6;
    if scopes {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    let groups: [(&[std::path::PathBuf], _); 4] = [
        (&policy.list, AccessFs::ReadDir.into()),
        (&policy.read_exec, read_exec),
        (&policy.read_write, all),
        (&policy.devices, devices),
    ];
    for (paths, access) in groups {
        for path in paths {
            let fd = PathFd::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
            created = created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(err)?;
        }
    }
    if tcp {
        for &port in &policy.tcp_ports {
            created = created
                .add_rule(NetPort::new(
                    port,
                    AccessNet::BindTcp | AccessNet::ConnectTcp,
                ))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    report.landlock_status = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced",
        RulesetStatus::NotEnforced => "not enforced",
    }
    .into();
    report.landlock_tcp = tcp && status.ruleset != RulesetStatus::NotEnforced;
    report.landlock_scopes = scopes && status.ruleset != RulesetStatus::NotEnforced;
    Ok(())
}
