//! The seccomp layer: syscalls no sandboxed program needs and many escapes use.
//!
//! A deny list over a default-allow filter, so ordinary programs (interpreters, compilers,
//! package managers) work unchanged. Four filters are stacked because each returns its own
//! errno: the general list fails with `EPERM`, `clone3` with `ENOSYS` (so libc falls back to
//! `clone`, whose flags this filter can inspect), sockets of families the sandbox has no use
//! for with `EAFNOSUPPORT`, and sockets of the transport protocols it has no use for
//! (Multipath TCP, UDP-Lite, SCTP) with `EPROTONOSUPPORT`, which programs that try MPTCP
//! first take as "fall back to TCP". Every filter kills a process that makes a syscall of
//! another architecture (32-bit `int 0x80` calls would otherwise bypass the rules), and x32
//! syscall numbers are refused.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// Namespace flags that `clone` and `unshare` may not carry.
const NAMESPACE_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// Transport protocols refused in `socket` and `socketpair` with `EPROTONOSUPPORT`, whatever
/// the family and type: Multipath TCP (`IPPROTO_MPTCP`) is stream traffic that Landlock's TCP
/// rules do not see, and UDP-Lite and SCTP are protocol stacks (SCTP a module the kernel
/// would load on demand) that nothing in a sandbox needs.
const REFUSED_PROTOCOLS: [i32; 3] = [
    libc::IPPROTO_MPTCP,
    libc::IPPROTO_UDPLITE,
    libc::IPPROTO_SCTP,
];

/// Syscalls refused outright with `EPERM`.
fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        // Mounts and root changes.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // Namespaces.
        libc::SYS_setns,
        // Reaching into other processes.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_process_madvise,
        libc::SYS_kcmp,
        libc::SYS_pidfd_getfd,
        // Kernel keyrings.
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        // Kernel attack surface with a long CVE history.
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_fanotify_init,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        // The machine itself.
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_vhangup,
        libc::SYS_lookup_dcookie,
        libc::SYS_move_pages,
        libc::SYS_migrate_pages,
        libc::SYS_mbind,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS_ustat,
        libc::SYS_sysfs,
        libc::SYS_modify_ldt,
    ]);
    v
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    // Only fails for an argument index above 5, which no caller here uses.
    SeccompCondition::new(arg, len, op, value).unwrap_or_else(|_| unreachable!())
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    // Only fails for an empty list, which no caller here passes.
    SeccompRule::new(conditions).unwrap_or_else(|_| unreachable!())
}

/// The filters' source, kept as data so tests can inspect it.
#[derive(Debug)]
pub(crate) struct Filters {
    /// `(name, program)` in the order they are installed.
    pub(crate) programs: Vec<(&'static str, BpfProgram)>,
    /// Syscalls refused entirely or by argument.
    pub(crate) rules: u32,
}

/// Builds the filters for the machine's architecture.
pub(crate) fn build() -> Result<Filters, seccompiler::BackendError> {
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| seccompiler::BackendError::InvalidTargetArch(std::env::consts::ARCH.into()))?;

    // 1. EPERM: the deny list, namespace flags on clone/unshare, terminal injection.
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = denied_syscalls()
        .into_iter()
        .map(|nr| (nr, vec![]))
        .collect();
    let ns_rules = |arg: u8| -> Vec<SeccompRule> {
        NAMESPACE_FLAGS
            .iter()
            .map(|&f| {
                rule(vec![cond(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(f),
                    f,
                )])
            })
            .collect()
    };
    eperm.insert(libc::SYS_clone, ns_rules(0));
    eperm.insert(libc::SYS_unshare, ns_rules(0));
    // TIOCSTI pushes bytes into a terminal's input; TIOCLINUX can do the same on a VT.
    // Compare only the low 32 bits of the request (CVE-2019-10063).
    eperm.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCSTI,
            )]),
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCLINUX,
            )]),
        ],
    );
    let rules = eperm.len() as u32 + 2;
    let eperm = SeccompFilter::new(
        eperm,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;

    // 2. ENOSYS for clone3: its flags live in memory a filter cannot read.
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;

    // 3. EAFNOSUPPORT for socket families other than unix, IPv4, IPv6 and netlink-route.
    let allowed_family =
        |arg: u8, f: i32| cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, f as u64);
    let socket_rules = vec![
        rule(vec![
            allowed_family(0, libc::AF_UNIX),
            allowed_family(0, libc::AF_INET),
            allowed_family(0, libc::AF_INET6),
            allowed_family(0, libc::AF_NETLINK),
        ]),
        // Netlink only for NETLINK_ROUTE (the sandbox's own interfaces and routes).
        rule(vec![
            cond(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::AF_NETLINK as u64,
            ),
            cond(
                2,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::NETLINK_ROUTE as u64,
            ),
        ]),
    ];
    let socketpair_rules = vec![rule(vec![allowed_family(0, libc::AF_UNIX)])];
    let afnosupport = SeccompFilter::new(
        [
            (libc::SYS_socket, socket_rules),
            (libc::SYS_socketpair, socketpair_rules),
        ]
        .into_iter()
        .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        arch,
    )?;

    // 4. EPROTONOSUPPORT for the refused transport protocols. The protocol is an `int`:
    // compare its low 32 bits, as the kernel reads it.
    let protocol_rules = || -> Vec<SeccompRule> {
        REFUSED_PROTOCOLS
            .iter()
            .map(|&p| {
                rule(vec![cond(
                    2,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    p as u64,
                )])
            })
            .collect()
    };
    let protonosupport = SeccompFilter::new(
        [
            (libc::SYS_socket, protocol_rules()),
            (libc::SYS_socketpair, protocol_rules()),
        ]
        .into_iter()
        .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPROTONOSUPPORT as u32),
        arch,
    )?;

    let mut programs = Vec::new();
    for (name, filter) in [
        ("deny-list", eperm),
        ("clone3", enosys),
        ("socket-families", afnosupport),
        ("socket-protocols", protonosupport),
    ] {
        let mut prog: BpfProgram = filter.try_into()?;
        refuse_x32(&mut prog);
        programs.push((name, prog));
    }
    Ok(Filters {
        programs,
        rules: rules + 3,
    })
}

/// Inserts, right after the architecture check, a test that refuses x32 syscall numbers
/// (bit 30 set), which share x86_64's audit architecture and would dodge the rules keyed
/// on syscall numbers.
fn refuse_x32(prog: &mut BpfProgram) {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JSET_K: u16 = 0x45;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // seccompiler's program starts with the architecture validation sequence: load arch,
    // compare, kill on mismatch. Find the first load of the syscall number (offset 0) that
    // follows it and insert before it; jumps inside the program are relative and all point
    // forward past the insertion point, so they stay valid.
    let Some(pos) = prog.iter().position(|i| i.code == BPF_LD_W_ABS && i.k == 0) else {
        return;
    };
    let insert = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JMP_JSET_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
    ];
    prog.splice(pos..pos, insert);
}

/// Installs the filters on the calling thread (and, through inheritance, on everything it
/// starts afterwards). Sets `no_new_privs` first, as seccomp requires.
pub(crate) fn apply(filters: &Filters) -> Result<(), seccompiler::Error> {
    for (_, prog) in &filters.programs {
        seccompiler::apply_filter(prog)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build_for_this_machine() {
        let f = build().unwrap();
        assert_eq!(f.programs.len(), 4);
        assert!(f.rules > 50, "deny list unexpectedly short: {}", f.rules);
        for (name, prog) in &f.programs {
            assert!(prog.len() < 4096, "{name} too long for BPF: {}", prog.len());
        }
    }

    #[test]
    fn x32_check_sits_after_the_arch_check() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let f = build().unwrap();
        let (_, prog) = &f.programs[0];
        // Arch validation loads offset 4 (arch) first.
        assert_eq!(prog[0].k, 4);
        let jset = prog
            .iter()
            .position(|i| i.code == 0x45 && i.k == 0x4000_0000);
        let first_nr_load = prog.iter().position(|i| i.code == 0x20 && i.k == 0);
        assert!(jset.is_some());
        assert!(first_nr_load.unwrap() < jset.unwrap());
    }

    #[test]
    fn the_list_covers_the_escape_suite() {
        let denied = denied_syscalls();
        for nr in [
            libc::SYS_mount,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_keyctl,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_setns,
            libc::SYS_pivot_root,
            libc::SYS_process_vm_readv,
        ] {
            assert!(denied.contains(&nr), "syscall {nr} not denied");
        }
    }
}
