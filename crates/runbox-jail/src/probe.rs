//! Host checks for `runbox doctor`: what the kernel offers before any sandbox is started.

use std::fs;

/// What the kernel offers for each layer.
#[derive(Debug, Clone)]
pub struct HostProbe {
    /// Kernel release.
    pub kernel: String,
    /// The server's effective uid.
    pub euid: u32,
    /// Whether user namespaces can be created by this user (only needed when not root).
    pub user_namespaces: Result<(), String>,
    /// Whether seccomp filters are available.
    pub seccomp: Result<(), String>,
    /// Landlock ABI (0: none).
    pub landlock_abi: u32,
}

fn read_trim(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Probes the running kernel.
pub fn probe() -> HostProbe {
    let euid = nix::unistd::geteuid().as_raw();
    let user_namespaces = (|| {
        if read_trim("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            return Err("user.max_user_namespaces is 0".to_owned());
        }
        if read_trim("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0")
            && euid != 0
        {
            return Err(
                "kernel.unprivileged_userns_clone is 0 (enable it, or run as root)".to_owned(),
            );
        }
        if read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
            && euid != 0
        {
            return Err(
                "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"
                    .to_owned(),
            );
        }
        Ok(())
    })();
    let seccomp = match read_trim("/proc/sys/kernel/seccomp/actions_avail") {
        Some(a) if a.split_whitespace().any(|x| x == "errno") => Ok(()),
        Some(a) => Err(format!("seccomp lacks the errno action (has: {a})")),
        None => Err("the kernel has no seccomp filter support".to_owned()),
    };
    HostProbe {
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        euid,
        user_namespaces,
        seccomp,
        landlock_abi: crate::sys::landlock_abi_version(),
    }
}
