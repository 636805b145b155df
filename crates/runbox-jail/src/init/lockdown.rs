//! The last steps of setting up a sandbox, in this order: rlimits, the sandbox's identity
//! (uid, gid, no groups), no capabilities at all, `no_new_privs`, Landlock, seccomp. Each
//! applies to the init and is inherited by everything it starts.

use caps::CapSet;
use nix::sys::resource::{Resource, setrlimit};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

use super::{SetupError, landlock, seccomp};
use crate::policy::{Identity, JailPolicy};
use crate::report::LayerReport;

/// Applies rlimits, identity, capabilities, `no_new_privs`, Landlock and seccomp.
pub(crate) fn apply(policy: &JailPolicy, report: &mut LayerReport) -> Result<(), SetupError> {
    let filters = seccomp::build().map_err(SetupError::at("build the seccomp filters"))?;
    set_rlimits(policy, report)?;
    drop_identity(&policy.identity)?;
    drop_capabilities()?;
    report.capabilities_dropped = true;
    nix::sys::prctl::set_no_new_privs().map_err(SetupError::at("set no_new_privs"))?;
    report.no_new_privs = nix::sys::prctl::get_no_new_privs().unwrap_or(false);
    landlock::apply(&policy.spec.landlock, report).map_err(|e| SetupError::new("landlock", e))?;
    // Not dumpable: the sandbox's processes share the init's uid (and, in a user namespace,
    // would otherwise be able to open /proc/1/mem); this puts the init's /proc files and
    // ptrace out of their reach. Processes it starts become dumpable again at execve.
    nix::sys::prctl::set_dumpable(false).map_err(SetupError::at("clear the dumpable flag"))?;
    seccomp::apply(&filters).map_err(SetupError::at("install the seccomp filters"))?;
    report.seccomp_filters = filters.programs.len() as u32;
    report.seccomp_rules = filters.rules;
    Ok(())
}

fn set_rlimits(policy: &JailPolicy, report: &mut LayerReport) -> Result<(), SetupError> {
    let r = &policy.spec.rlimits;
    let mut limits = vec![
        ("RLIMIT_NPROC", Resource::RLIMIT_NPROC, r.nproc),
        ("RLIMIT_NOFILE", Resource::RLIMIT_NOFILE, r.nofile),
        ("RLIMIT_FSIZE", Resource::RLIMIT_FSIZE, r.fsize),
        ("RLIMIT_CORE", Resource::RLIMIT_CORE, 0),
        ("RLIMIT_MEMLOCK", Resource::RLIMIT_MEMLOCK, r.memlock),
    ];
    if r.cpu_seconds > 0 {
        limits.push(("RLIMIT_CPU", Resource::RLIMIT_CPU, r.cpu_seconds));
    }
    if r.stack > 0 {
        limits.push(("RLIMIT_STACK", Resource::RLIMIT_STACK, r.stack));
    }
    if r.data > 0 {
        limits.push(("RLIMIT_DATA", Resource::RLIMIT_DATA, r.data));
    }
    for (name, resource, value) in limits {
        setrlimit(resource, value, value).map_err(SetupError::at(format!("set {name}")))?;
        report.rlimits.push((name.to_owned(), value));
    }
    Ok(())
}

fn drop_identity(identity: &Identity) -> Result<(), SetupError> {
    let (uid, gid) = (Uid::from_raw(identity.uid()), Gid::from_raw(identity.gid()));
    if uid.is_root() {
        return Err(SetupError::new(
            "drop privileges",
            "refusing to run a sandbox as uid 0",
        ));
    }
    // The bounding set can only be emptied while CAP_SETPCAP is still held.
    crate::sys::drop_bounding_set().map_err(SetupError::at("empty the capability bounding set"))?;
    if let Identity::HostUid { .. } = identity {
        // Supplementary groups can only be set outside a user namespace (inside, setgroups is
        // denied so no group of the host's can be dropped to gain access).
        setgroups(&[gid]).map_err(SetupError::at("setgroups"))?;
    }
    setresgid(gid, gid, gid).map_err(SetupError::at("setresgid"))?;
    setresuid(uid, uid, uid).map_err(SetupError::at("setresuid"))?;
    Ok(())
}

fn drop_capabilities() -> Result<(), SetupError> {
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(SetupError::at(format!("clear {set:?} capabilities")))?;
    }
    let left: Vec<_> = [
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
        CapSet::Ambient,
    ]
    .into_iter()
    .filter_map(|set| {
        caps::read(None, set)
            .ok()
            .filter(|c| !c.is_empty())
            .map(|c| (set, c))
    })
    .collect();
    if !left.is_empty() || !crate::sys::bounding_set_empty() {
        return Err(SetupError::new(
            "drop capabilities",
            format!("capabilities remain: {left:?}"),
        ));
    }
    Ok(())
}
