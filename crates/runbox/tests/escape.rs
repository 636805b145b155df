//! The escape suite of SECURITY.md: every way out we know of, tried from inside a real
//! sandbox, asserting the error the kernel returns and that the host is unchanged.
//!
//! Runs as root in CI, and again as an unprivileged user (`scripts/test-unprivileged`), so
//! both the host-uid and the user-namespace paths stay proven. File-tool escapes (symlinks
//! and `..` through read_file/write_file/list_files) belong with those tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::time::{Duration, Instant};

use runbox_core::{Backend, Language, Limits};
use util::*;

/// Runs Python that prints `name=<errno>` lines (0: the call succeeded) and returns them.
async fn errnos(
    b: &runbox_local::LocalBackend,
    id: &runbox_core::SandboxId,
    code: &str,
) -> Vec<(String, i32)> {
    let o = py(b, id, &format!("{PY_SYSCALL}\n{code}")).await;
    assert!(
        o.error.is_none(),
        "probe failed: {:?}\n{}",
        o.error,
        o.stderr
    );
    o.stdout
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

fn expect(results: &[(String, i32)], name: &str, allowed: &[i32]) {
    let got = results
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no result for {name}: {results:?}"))
        .1;
    assert!(
        allowed.contains(&got),
        "{name}: errno {got} ({}), expected one of {allowed:?}",
        nix::errno::Errno::from_raw(got).desc()
    );
}

#[tokio::test]
async fn host_secrets_and_state_are_not_visible() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let host_dir = tempfile::tempdir().unwrap();
    let secret = canary("secret");
    std::fs::write(host_dir.path().join("secret.txt"), &secret).unwrap();
    let code = format!(
        r#"
import os
def probe(name, path):
    try:
        with open(path, 'rb') as f: f.read(64)
        print(f"{{name}}=0")
    except OSError as e:
        print(f"{{name}}={{e.errno}}")
probe('shadow', '/etc/shadow')
probe('host_file', '{host}')
probe('state', '{state}')
probe('server_exe', '/proc/{server}/exe')
probe('home', '/root/.bash_history')
probe('sys', '/sys/kernel/notes')
probe('kcore', '/proc/kcore')
probe('init_mem', '/proc/1/mem')
probe('init_exe', '/proc/1/exe')
print('init_cmdline_clean=' + ('0' if b'/' not in open('/proc/1/cmdline', 'rb').read() else '1'))
found = [p for p in ('/run/runbox', '/sys', '/home', '/boot', '/var/lib', '/srv') if os.path.exists(p)]
print('visible=' + str(len(found)))
print('found:', found)
"#,
        host = host_dir.path().join("secret.txt").display(),
        state = b.host().config().state_dir.join("uids").display(),
        server = std::process::id(),
    );
    let r = errnos(&b, &id, &code).await;
    for name in ["shadow", "host_file", "state", "server_exe", "home", "sys"] {
        expect(&r, name, &[libc::ENOENT]);
    }
    // /proc/kcore is masked by /dev/null (reading it yields nothing) where the kernel has it.
    expect(&r, "kcore", &[0, libc::EACCES, libc::EPERM, libc::ENOENT]);
    expect(&r, "visible", &[0]);
    // The init is not dumpable: its memory and executable are out of reach, and its
    // command line names no host path.
    expect(&r, "init_mem", &[libc::EACCES, libc::EPERM]);
    expect(&r, "init_exe", &[libc::EACCES, libc::EPERM]);
    expect(&r, "init_cmdline_clean", &[0]);
    b.close(&id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(host_dir.path().join("secret.txt")).unwrap(),
        secret
    );
}

#[tokio::test]
async fn the_runtime_is_read_only_and_the_host_unchanged() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let python = b.runtime().python.as_ref().unwrap().path.clone();
    let before = std::fs::metadata(&python).unwrap().modified().unwrap();
    let code = format!(
        r#"
import os
def attempt(name, fn):
    try:
        fn(); print(f"{{name}}=0")
    except OSError as e:
        print(f"{{name}}={{e.errno}}")
attempt('usr', lambda: open('/usr/bin/runbox-evil', 'w'))
attempt('etc', lambda: open('/etc/passwd', 'a'))
attempt('root', lambda: os.mkdir('/evil'))
attempt('python', lambda: open('{python}', 'ab'))
attempt('proc_sys', lambda: open('/proc/sys/kernel/hostname', 'w').write('x'))
attempt('sysrq', lambda: open('/proc/sysrq-trigger', 'w').write('b'))
attempt('dev', lambda: open('/dev/evil', 'w'))
attempt('workspace', lambda: open('/workspace/ok', 'w').write('fine'))
attempt('tmp', lambda: open('/tmp/ok', 'w').write('fine'))
"#,
        python = python.display()
    );
    let r = errnos(&b, &id, &code).await;
    let refused = [libc::EROFS, libc::EACCES, libc::EPERM];
    for name in ["usr", "etc", "root", "python", "proc_sys", "dev"] {
        expect(&r, name, &refused);
    }
    // Read-only where the kernel has it (not every kernel is built with magic SysRq).
    expect(
        &r,
        "sysrq",
        &[libc::EROFS, libc::EACCES, libc::EPERM, libc::ENOENT],
    );
    expect(&r, "workspace", &[0]);
    expect(&r, "tmp", &[0]);
    b.close(&id).await.unwrap();
    assert!(!std::path::Path::new("/usr/bin/runbox-evil").exists());
    assert_eq!(
        std::fs::metadata(&python).unwrap().modified().unwrap(),
        before
    );
}

#[tokio::test]
async fn fork_bomb_hits_the_process_limit_and_leaves_nothing() {
    let b = backend().await;
    let id = sandbox_with(
        &b,
        Limits {
            pids: 64,
            ..Default::default()
        },
    )
    .await;
    let tag = canary("forkbomb");
    let code = format!(
        r#"
import os, time
n = 0
try:
    while True:
        pid = os.fork()
        if pid == 0:
            os.execv('/bin/sleep', ['{tag}', '300'])
        n += 1
except OSError as e:
    print(f"fork={{e.errno}}")
    print(f"count={{n}}")
"#
    );
    let o = run_for(
        &b,
        &id,
        Language::Python,
        &format!("{PY_SYSCALL}\n{code}"),
        Duration::from_secs(30),
    )
    .await;
    assert!(
        o.stdout.contains(&format!("fork={}", libc::EAGAIN)),
        "{o:?}"
    );
    let count: u32 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("count="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(count < 64, "forked {count} processes past a limit of 64");
    // The host never saw more than the limit, and sees none after close.
    assert!(host_processes_with(&tag).len() <= 64);
    // The sandbox is full of sleepers: starting anything more is refused as a limit, with a
    // message that says what to do.
    let e = b
        .exec(
            &id,
            runbox_core::ExecRequest::new(Language::Bash, "true", TIMEOUT),
            Default::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, runbox_core::Error::LimitReached(_)), "{e}");
    assert!(e.to_string().contains("64 processes"), "{e}");
    b.close(&id).await.unwrap();
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
}

#[tokio::test]
async fn memory_bomb_is_stopped_by_the_memory_limit() {
    // With a cgroup the sandbox as a whole is capped; without one (--no-cgroups) each
    // process is, by RLIMIT_DATA. Either way the bomb stops at the limit.
    let b = backend().await;
    let id = sandbox_with(
        &b,
        Limits {
            memory_mb: 128,
            ..Default::default()
        },
    )
    .await;
    let enforced = b.status(&id).await.unwrap().enforced;
    let memory = enforced.memory.clone().expect("no memory limit holds");
    assert_eq!(memory.value, 128 << 20, "{enforced:?}");
    let per = if b.host().cgroups().is_ok() {
        runbox_core::Scope::Sandbox
    } else {
        runbox_core::Scope::Process
    };
    assert_eq!(memory.per, per, "{enforced:?}");
    let o = run_for(
        &b,
        &id,
        Language::Python,
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))",
        Duration::from_secs(60),
    )
    .await;
    let e = o.error.clone().expect("the bomb must fail");
    assert_eq!(e.name, "MemoryError", "{o:?}");
    // The sandbox still works afterwards.
    let o = py(&b, &id, "sum(range(10))").await;
    assert_eq!(value(&o).as_deref(), Some("45"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn disk_fill_is_capped_in_bytes_and_inodes() {
    let b = backend().await;
    let id = sandbox_with(
        &b,
        Limits {
            workspace_mb: 16,
            tmp_mb: 8,
            inodes: 500,
            ..Default::default()
        },
    )
    .await;
    let o = sh(
        &b,
        &id,
        "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1 | grep -o 'No space left on device'; \
         dd if=/dev/zero of=/tmp/big bs=1M count=64 2>&1 | grep -o 'No space left on device'; \
         df -k /workspace /tmp | tail -n 2",
    )
    .await;
    assert_eq!(
        o.stdout.matches("No space left on device").count(),
        2,
        "{o:?}"
    );
    let o = sh(
        &b,
        &id,
        "rm -f /workspace/big; mkdir /workspace/many && cd /workspace/many && \
         for i in $(seq 1 2000); do : > f$i || { echo stopped at $i; break; }; done 2>&1 | tail -n 2",
    )
    .await;
    assert!(o.stdout.contains("No space left on device"), "{o:?}");
    assert!(o.stdout.contains("stopped at"), "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn network_is_unreachable_and_host_loopback_untouched() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        r#"
import socket, errno
def tcp(name, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port)); print(f"{{name}}=0")
    except OSError as e:
        print(f"{{name}}={{e.errno}}")
tcp('outside', '1.1.1.1', 443)
tcp('metadata', '169.254.169.254', 80)
tcp('host_loopback', '127.0.0.1', {port})
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b'\x00' * 12, ('8.8.8.8', 53)); print("udp_dns=0")
except OSError as e:
    print(f"udp_dns={{e.errno}}")
try:
    socket.getaddrinfo('example.com', 443); print("resolve=0")
except socket.gaierror as e:
    print("resolve=-1")
def family(name, *args):
    try:
        socket.socket(*args); print(f"{{name}}=0")
    except OSError as e:
        print(f"{{name}}={{e.errno}}")
family('raw', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
family('packet', 17, socket.SOCK_RAW, 0)
family('vsock', 40, socket.SOCK_STREAM, 0)
family('netlink_audit', socket.AF_NETLINK, socket.SOCK_RAW, 9)
family('netlink_route', socket.AF_NETLINK, socket.SOCK_RAW, 0)
ifs = [name for _, name in socket.if_nameindex()]
print('interfaces=' + str(len(ifs)))
print('names:', ifs)
"#
    );
    let r = errnos(&b, &id, &code).await;
    expect(&r, "outside", &[libc::ENETUNREACH, libc::EACCES]);
    expect(&r, "metadata", &[libc::ENETUNREACH, libc::EACCES]);
    // The sandbox's loopback is its own: the host's listener is not there (and Landlock
    // refuses TCP connect outright).
    expect(&r, "host_loopback", &[libc::ECONNREFUSED, libc::EACCES]);
    expect(&r, "udp_dns", &[libc::ENETUNREACH]);
    expect(&r, "resolve", &[-1]);
    expect(&r, "raw", &[libc::EPERM, libc::EACCES]);
    expect(&r, "packet", &[libc::EAFNOSUPPORT]);
    expect(&r, "vsock", &[libc::EAFNOSUPPORT]);
    expect(&r, "netlink_audit", &[libc::EAFNOSUPPORT]);
    expect(&r, "netlink_route", &[0]);
    expect(&r, "interfaces", &[1]);
    b.close(&id).await.unwrap();
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host listener received a connection from the sandbox"
    );
}

#[tokio::test]
async fn dangerous_syscalls_are_refused() {
    let b = backend().await;
    let id = sandbox(&b).await;
    // x86_64 syscall numbers; the filter itself is built from libc's constants.
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIP dangerous_syscalls: numbers below are x86_64's");
        return;
    }
    let code = r#"
import os, ctypes
buf = ctypes.create_string_buffer(64)
cases = {
    'ptrace_attach': (101, 16, 1, 0, 0),
    'process_vm_readv': (310, 1, 0, 1, 0, 1, 0),
    'mount': (165, 0, 0, 0, 0, 0),
    'pivot_root': (155, 0, 0),
    'chroot': (161, 0),
    'unshare_user': (272, 0x10000000),
    'unshare_mount': (272, 0x00020000),
    'clone_newuser': (56, 0x10000000 | 17, 0, 0, 0, 0),
    'setns': (308, 0, 0),
    'add_key': (248, 0, 0, 0, 0, 0),
    'keyctl': (250, 0, 0),
    'io_uring_setup': (425, 8, ctypes.addressof(buf)),
    'bpf': (321, 0, 0, 0),
    'perf_event_open': (298, 0, 0, -1, -1, 0),
    'userfaultfd': (323, 0),
    'kexec_load': (246, 0, 0, 0, 0),
    'init_module': (175, 0, 0, 0),
    'reboot': (169, 0, 0, 0, 0),
    'sethostname': (170, 0, 0),
    'open_by_handle_at': (304, 0, 0, 0),
    'kcmp': (312, 1, 1, 0, 0, 0),
    'pidfd_getfd': (438, 0, 0, 0),
    'clone3': (435, 0, 0),
    'x32_getpid': (0x40000000 | 39,),
    'iopl': (172, 3),
    'swapon': (167, 0, 0),
    'syslog': (103, 3, 0, 0),
}
for name, (nr, *args) in cases.items():
    r, err = sc(nr, *args)
    print(f"{name}={err if r < 0 else 0}")
"#;
    let r = errnos(&b, &id, code).await;
    for name in [
        "ptrace_attach",
        "process_vm_readv",
        "mount",
        "pivot_root",
        "chroot",
        "unshare_user",
        "unshare_mount",
        "clone_newuser",
        "setns",
        "add_key",
        "keyctl",
        "io_uring_setup",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "kexec_load",
        "init_module",
        "reboot",
        "sethostname",
        "open_by_handle_at",
        "kcmp",
        "pidfd_getfd",
        "iopl",
        "swapon",
        "syslog",
    ] {
        expect(&r, name, &[libc::EPERM]);
    }
    expect(&r, "clone3", &[libc::ENOSYS]);
    expect(&r, "x32_getpid", &[libc::ENOSYS]);
    // Tools that wrap these fail too.
    let o = sh(
        &b,
        &id,
        "unshare -r true; echo \"unshare=$?\"; mount -t tmpfs none /tmp 2>&1; echo \"mount=$?\"",
    )
    .await;
    assert!(o.stdout.contains("unshare=1"), "{o:?}");
    assert!(!o.stdout.contains("mount=0"), "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn mptcp_udplite_and_sctp_sockets_are_refused_while_tcp_and_udp_work() {
    // A port Landlock lets the sandbox use on its own loopback, so TCP can be shown working
    // (and Multipath TCP, which Landlock's TCP rules do not see, refused beside it).
    const PORT: u16 = 8123;
    let b = backend_with(|c| c.sandbox_tcp_ports = vec![PORT]).await;
    let id = sandbox(&b).await;
    let code = format!(
        r#"
import socket, platform
def make(name, family, kind, proto):
    try:
        socket.socket(family, kind, proto).close(); print(f"{{name}}=0")
    except OSError as e:
        print(f"{{name}}={{e.errno}}")
for family, v in ((socket.AF_INET, '4'), (socket.AF_INET6, '6')):
    make('mptcp' + v, family, socket.SOCK_STREAM, 262)
    make('udplite' + v, family, socket.SOCK_DGRAM, 136)
    make('sctp_stream' + v, family, socket.SOCK_STREAM, 132)
    make('sctp_seqpacket' + v, family, socket.SOCK_SEQPACKET, 132)
    make('tcp' + v, family, socket.SOCK_STREAM, 0)
    make('tcp_named' + v, family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    make('udp' + v, family, socket.SOCK_DGRAM, 0)
    make('udp_named' + v, family, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
# The kernel reads the protocol as an int: bits above 32 change nothing.
if platform.machine() == 'x86_64':
    r, err = sc(41, socket.AF_INET, socket.SOCK_STREAM, 262 | (1 << 32))
    print(f"mptcp_high_bits={{err if r < 0 else 0}}")
    pair = (ctypes.c_int * 2)()
    r, err = sc(53, socket.AF_UNIX, socket.SOCK_STREAM, 262, ctypes.addressof(pair))
    print(f"socketpair_mptcp={{err if r < 0 else 0}}")
else:
    print(f"mptcp_high_bits={{errno.EPROTONOSUPPORT}}")
    print(f"socketpair_mptcp={{errno.EPROTONOSUPPORT}}")
# Ordinary traffic on the sandbox's own loopback still flows.
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(('127.0.0.1', 0))
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'ping', a.getsockname())
print('udp_round_trip=' + ('0' if a.recv(16) == b'ping' else '1'))
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM); server.bind(('127.0.0.1', {PORT})); server.listen()
client = socket.create_connection(('127.0.0.1', {PORT}), timeout=10); client.sendall(b'pong')
conn, _ = server.accept()
print('tcp_round_trip=' + ('0' if conn.recv(16) == b'pong' else '1'))
try:
    m = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); m.connect(('127.0.0.1', {PORT})); print('mptcp_connect=0')
except OSError as e:
    print(f"mptcp_connect={{e.errno}}")
"#
    );
    let r = errnos(&b, &id, &code).await;
    for v in ["4", "6"] {
        for name in ["mptcp", "udplite", "sctp_stream", "sctp_seqpacket"] {
            expect(&r, &format!("{name}{v}"), &[libc::EPROTONOSUPPORT]);
        }
        for name in ["tcp", "tcp_named", "udp", "udp_named"] {
            expect(&r, &format!("{name}{v}"), &[0]);
        }
    }
    expect(&r, "mptcp_high_bits", &[libc::EPROTONOSUPPORT]);
    expect(&r, "socketpair_mptcp", &[libc::EPROTONOSUPPORT]);
    expect(&r, "udp_round_trip", &[0]);
    expect(&r, "tcp_round_trip", &[0]);
    expect(&r, "mptcp_connect", &[libc::EPROTONOSUPPORT]);
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn terminal_injection_is_refused_even_with_high_bits() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let code = r#"
import os, fcntl, termios, ctypes
master, slave = os.openpty()
for name, req in (('tiocsti', termios.TIOCSTI), ('tiocsti_high', termios.TIOCSTI | (1 << 32))):
    r, err = sc(16, slave, req, ctypes.addressof(ctypes.c_char(b'x')))
    print(f"{name}={err if r < 0 else 0}")
try:
    open('/dev/tty'); print('ctty=0')
except OSError as e:
    print(f'ctty={e.errno}')
"#;
    let r = errnos(&b, &id, code).await;
    expect(&r, "tiocsti", &[libc::EPERM]);
    expect(&r, "tiocsti_high", &[libc::EPERM]);
    // No controlling terminal to inject into anyway.
    expect(&r, "ctty", &[libc::ENXIO]);
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn thirty_two_bit_syscalls_kill_the_process() {
    let b = backend().await;
    let id = sandbox(&b).await;
    if !cfg!(target_arch = "x86_64") || !std::path::Path::new("/usr/bin/gcc").exists() {
        eprintln!("SKIP 32-bit syscalls: needs x86_64 and gcc");
        return;
    }
    // int 0x80 enters the kernel's 32-bit table (eax=20: getpid there); the filter's
    // architecture check kills the process before any rule could be bypassed.
    let o = sh(
        &b,
        &id,
        "cd /workspace && printf 'int main(void){int r; __asm__ volatile(\"int $0x80\":\"=a\"(r):\"a\"(20)); return r > 0 ? 0 : 3;}' > i386.c \
         && gcc -O0 -o i386 i386.c && { ./i386; echo \"status=$?\"; }",
    )
    .await;
    assert!(
        o.stdout.contains(&format!("status={}", 128 + libc::SIGSYS)),
        "{o:?}"
    );
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn privileges_are_gone_and_setuid_does_not_help() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = sh(
        &b,
        &id,
        "grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; \
         ls -l /usr/bin/su /usr/bin/mount 2>/dev/null | cut -c1-10; \
         su -c id root </dev/null 2>&1 | head -n1; echo \"su=${PIPESTATUS[0]}\"",
    )
    .await;
    let zero = "0000000000000000";
    for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert!(
            o.stdout.contains(&format!("{cap}:\t{zero}")),
            "{cap} not empty: {}",
            o.stdout
        );
    }
    assert!(o.stdout.contains("NoNewPrivs:\t1"));
    assert!(o.stdout.contains("Seccomp:\t2"));
    let uid_line = o.stdout.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        !uid_line.split_whitespace().skip(1).any(|u| u == "0"),
        "{uid_line}"
    );
    assert!(
        !o.stdout.contains("uid=0"),
        "a setuid binary gained root: {}",
        o.stdout
    );
    assert!(!o.stdout.contains("su=0"), "{}", o.stdout);
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn descriptors_and_environment_do_not_leak() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = sh(&b, &id, "ls -l /proc/$$/fd; echo ENV; env; echo INIT; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'").await;
    // No variable of the server's environment (the test process's, here, which CI seeds
    // with RUNBOX_TEST_SECRET) reaches the sandbox. The sandbox sets a few variables of its
    // own, by name; any other host variable found inside is a leak.
    const SANDBOX_SETS: [&str; 11] = [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "TERM",
        "TMPDIR",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "MPLBACKEND",
    ];
    let inside = o.stdout.split("ENV\n").nth(1).unwrap_or_default();
    // bash sets these itself: their names prove nothing, but the host's values must not show.
    const SHELL_SETS: [&str; 4] = ["PWD", "OLDPWD", "SHLVL", "_"];
    let inside_pairs: Vec<(&str, &str)> =
        inside.lines().filter_map(|l| l.split_once('=')).collect();
    let mut checked = 0;
    for (k, v) in std::env::vars() {
        if SANDBOX_SETS.contains(&k.as_str()) || v.len() < 4 {
            continue;
        }
        checked += 1;
        for (ik, iv) in &inside_pairs {
            assert!(
                *ik != k || SHELL_SETS.contains(ik),
                "server variable {k} leaked into the sandbox"
            );
            assert!(
                *iv != v || SANDBOX_SETS.contains(ik),
                "the value of server variable {k} leaked into the sandbox as {ik}"
            );
        }
        if k == "RUNBOX_TEST_SECRET" {
            assert!(
                !o.stdout.contains(&v),
                "the CI secret leaked into the sandbox"
            );
        }
    }
    assert!(checked > 0, "the test process has no variable to check");
    let fds: Vec<&str> = o
        .stdout
        .split("ENV\n")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" -> "))
        .collect();
    for line in &fds {
        let target = line.split(" -> ").nth(1).unwrap_or_default();
        assert!(
            target.starts_with("pipe:") || target == "/dev/null" || target.starts_with("/proc/"),
            "unexpected descriptor in the sandbox: {line}"
        );
    }
    // bash: stdin, stdout, stderr and its state pipe.
    assert!(fds.len() <= 4, "{fds:?}");
    let o = py(&b, &id, "import os\nsorted(os.listdir('/proc/self/fd'))").await;
    let listed = value(&o).unwrap();
    assert!(
        listed.matches('\'').count() / 2 <= 7,
        "python kernel holds too many fds: {listed}"
    );
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn signals_cannot_reach_the_server() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let me = std::process::id();
    let o = sh(
        &b,
        &id,
        &format!("kill -9 {me} 2>&1; echo \"direct=$?\"; kill -9 1 2>&1; echo \"init=$?\"; kill -9 -1; echo \"all=$?\""),
    )
    .await;
    // The server's pid does not exist in the sandbox's PID namespace; signals meant for the
    // sandbox's init are dropped; kill -1 reaches only the sandbox's own processes.
    assert!(o.stdout.contains("direct=1"), "{o:?}");
    // We are still here, and so is the sandbox.
    let o = sh(&b, &id, "echo alive").await;
    assert_eq!(o.stdout, "alive\n");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn daemons_that_ignore_sigterm_die_with_the_sandbox() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let tag = canary("daemon");
    let diag = b.diagnostics(&id).await.unwrap();
    let o = sh(
        &b,
        &id,
        &format!(
            "(trap '' TERM HUP INT; setsid bash -c 'trap \"\" TERM HUP; exec -a {tag} sleep 1000' & ) ; \
             python3 -c 'import os,time\nif os.fork()==0:\n  os.setsid()\n  if os.fork()==0:\n    os.execv(\"/bin/sleep\", [\"{tag}\", \"1000\"])\n' ; sleep 0.3; echo spawned"
        ),
    )
    .await;
    assert_eq!(o.stdout, "spawned\n", "{o:?}");
    assert_eq!(
        host_processes_with(&tag).len(),
        2,
        "daemons not running on the host?"
    );
    b.close(&id).await.unwrap();
    // Nothing of the sandbox remains: no process, no cgroup, no stage one.
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
    for dir in &diag.cgroup_paths {
        assert!(!dir.exists(), "cgroup {} left behind", dir.display());
    }
    if let Some(pid) = diag.stage_one_pid {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "stage one {pid} left behind"
        );
    }
    // The sandbox's mounts lived only in its own namespace.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&b.host().config().state_dir.display().to_string()));
}

#[tokio::test]
async fn one_sandbox_cannot_touch_another() {
    let b = backend().await;
    let a = sandbox(&b).await;
    let c = sandbox(&b).await;
    let tag = canary("neighbour");
    sh(
        &b,
        &a,
        &format!("echo {tag} > /workspace/mine; (exec -a {tag} sleep 1000 &)"),
    )
    .await;
    let o = sh(
        &b,
        &c,
        "cat /workspace/mine 2>&1; ps -eo args | grep -c '[r]unbox-canary-neighbour' || true",
    )
    .await;
    assert!(o.stdout.contains("No such file"), "{o:?}");
    assert!(o.stdout.trim_end().ends_with('0'), "{o:?}");
    if running_as_root() {
        let (da, dc) = (
            b.diagnostics(&a).await.unwrap(),
            b.diagnostics(&c).await.unwrap(),
        );
        assert_ne!(da.host_uid, dc.host_uid, "two sandboxes share a host uid");
        assert!(
            da.host_uid.unwrap() >= 1_000_000,
            "sandbox uid {:?} is in the human range",
            da.host_uid
        );
    }
    b.close(&a).await.unwrap();
    b.close(&c).await.unwrap();
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
}

#[tokio::test]
async fn the_boot_line_is_masked_and_host_objects_name_no_sandbox() {
    let state = tempfile::tempdir().unwrap();
    // A lease file a server that died left behind (as root, sandboxes lease host uids).
    let stale = state.path().join("uids").join("1500000001");
    if running_as_root() {
        std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
        std::fs::write(&stale, "").unwrap();
    }
    let b = backend_with(|c| c.jail.state_dir = state.path().to_owned()).await;
    assert!(!stale.exists(), "a lease file no sandbox holds was kept");
    let id = sandbox(&b).await;
    // The host's kernel command line (boot options, sometimes more) is not the sandbox's
    // business.
    assert!(!std::fs::read("/proc/cmdline").unwrap().is_empty());
    let o = py(&b, &id, "len(open('/proc/cmdline', 'rb').read())").await;
    assert_eq!(value(&o).as_deref(), Some("0"), "{o:?}");
    // Nothing other users of the host can list carries the sandbox's id.
    let diag = b.diagnostics(&id).await.unwrap();
    let secret = id.as_str().trim_start_matches("sbx_");
    for dir in &diag.cgroup_paths {
        assert!(
            !dir.display().to_string().contains(secret),
            "cgroup {} is named after the sandbox",
            dir.display()
        );
    }
    if b.host().cgroups().is_ok() {
        assert!(!diag.cgroup_paths.is_empty());
    }
    let uids = state.path().join("uids");
    let lease = diag.host_uid.map(|u| uids.join(u.to_string()));
    if let Some(lease) = &lease {
        assert!(lease.exists(), "no lease file while the sandbox lives");
    }
    b.close(&id).await.unwrap();
    if let Some(lease) = &lease {
        assert!(!lease.exists(), "the closed sandbox's lease file was kept");
    }
    let mut names = Vec::new();
    visit(state.path(), &mut names);
    assert!(
        names.iter().all(|n| !n.contains(secret)),
        "the state directory names the sandbox: {names:?}"
    );
}

/// Every path under `dir`.
fn visit(dir: &std::path::Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path().display().to_string());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            visit(&e.path(), out);
        }
    }
}

#[tokio::test]
async fn a_hundred_sandboxes_at_once() {
    let b = backend_with(|c| c.max_sandboxes = 100).await;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let b = b.clone();
        tasks.spawn(async move {
            let id = sandbox(&b).await;
            let o = sh(&b, &id, &format!("echo sandbox-{i}")).await;
            (i, id, o)
        });
    }
    let mut ids = Vec::new();
    let mut cgroup_dirs = std::collections::HashMap::new();
    while let Some(r) = tasks.join_next().await {
        let (i, id, o) = r.unwrap();
        assert_eq!(o.stdout, format!("sandbox-{i}\n"));
        cgroup_dirs.insert(id.clone(), b.diagnostics(&id).await.unwrap().cgroup_paths);
        ids.push(id);
    }
    let ids_closed = ids.clone();
    // The 101st is refused with a message that says what to do.
    let e = b.create(Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("maximum of 100"), "{e}");
    let mut closing = tokio::task::JoinSet::new();
    for id in ids {
        let b = b.clone();
        closing.spawn(async move { b.close(&id).await.unwrap() });
    }
    while closing.join_next().await.is_some() {}
    eprintln!(
        "100 sandboxes created, used and closed in {:?}",
        t.elapsed()
    );
    for id in &ids_closed {
        for dir in cgroup_dirs.get(id).into_iter().flatten() {
            assert!(!dir.exists(), "cgroup {} left behind", dir.display());
        }
    }
}

/// What a refused file operation must look like: a caller error, and none of `secret`.
fn refused<T: std::fmt::Debug>(r: Result<T, runbox_core::Error>, what: &str) {
    let e = r.expect_err(what);
    assert!(e.is_caller_error(), "{what}: {e}");
}

#[tokio::test]
async fn file_tools_stay_inside_the_sandbox() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let tag = canary("filetools");
    let host_dir = tempfile::tempdir().unwrap();
    let host_secret = host_dir.path().join("secret.txt");
    std::fs::write(&host_secret, &tag).unwrap();
    let host = host_secret.display().to_string();
    sh(
        &b,
        &id,
        &format!(
            "cd /workspace && ln -s /etc/passwd abs && ln -s ../../../../../../etc up && ln -s / root \
             && ln -s /proc/1/environ initenv && ln -s /proc/self/root selfroot && ln -s {host} hostfile \
             && mkdir -p /tmp/t && ln -s /workspace /tmp/t/cross"
        ),
    )
    .await;
    // `..` and paths outside the areas.
    for path in [
        "../../../../etc/passwd",
        "/workspace/../../../etc/shadow",
        "/workspace/../tmp/../../etc/passwd",
        "/etc/passwd",
        "/proc/1/environ",
        "/proc/self/mem",
        "/",
        host.as_str(),
    ] {
        refused(b.read_file(&id, path, 0, None).await, path);
        refused(b.list_files(&id, path, false).await, path);
    }
    // Symbolic links pointing out of the area, or across a mount, or through /proc.
    for path in [
        "abs",
        "up/passwd",
        "root/etc/hostname",
        "initenv",
        "selfroot/etc/passwd",
        "hostfile",
        "/tmp/t/cross/x",
    ] {
        refused(b.read_file(&id, path, 0, None).await, path);
    }
    // Listing a link reports the link itself and never what it points to.
    for link in ["up", "root"] {
        match b.list_files(&id, link, true).await {
            Ok(l) => {
                assert_eq!(l.entries.len(), 1, "{l:?}");
                assert_eq!(l.entries[0].kind, runbox_core::FileKind::Symlink);
                assert_eq!(l.entries[0].path, format!("/workspace/{link}"));
            }
            Err(e) => assert!(e.is_caller_error(), "{e}"),
        }
    }
    refused(
        b.list_files(&id, "root/etc", true).await,
        "list through root",
    );
    // Writes through the same links, or with '..', create nothing anywhere on the host.
    for path in [
        format!("up/{tag}"),
        format!("root/tmp/{tag}"),
        format!("../{tag}"),
        format!("/workspace/../../{tag}"),
        "hostfile".to_string(),
        format!("/tmp/t/cross/{tag}"),
    ] {
        refused(
            b.write_file(&id, &path, tag.as_bytes().to_vec(), false)
                .await,
            &path,
        );
    }
    // A recursive listing reports the links without following them.
    let listing = b.list_files(&id, "/workspace", true).await.unwrap();
    assert!(
        listing
            .entries
            .iter()
            .all(|e| e.path.starts_with("/workspace/")),
        "{listing:?}"
    );
    let up = listing.entries.iter().find(|e| e.name == "up").unwrap();
    assert_eq!(up.kind, runbox_core::FileKind::Symlink);
    b.close(&id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&host_secret).unwrap(),
        tag,
        "the host file changed"
    );
    for dir in ["/etc", "/tmp", "/"] {
        assert!(
            !std::path::Path::new(dir).join(&tag).exists(),
            "{dir}/{tag} was created on the host"
        );
    }
}

#[tokio::test]
async fn a_symlink_swapped_in_during_calls_never_leads_out() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let tag = canary("swap");
    // Inside the sandbox, swap /workspace/d atomically (renameat2 RENAME_EXCHANGE) between a
    // real directory and a symlink to / as fast as it can, while the server writes into and
    // reads from it: the classic time-of-check/time-of-use attack on a privileged helper.
    let flipper = r#"
cd /workspace && mkdir d && echo inside > d/f && ln -s / other && cat > /tmp/flip.py <<'PY'
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
swap = lambda: libc.syscall(316, -100, b"/workspace/d", -100, b"/workspace/other", 2)
if swap() != 0 or swap() != 0:
    raise SystemExit("renameat2 failed")
open("/workspace/flipping", "w").close()
while True:
    swap()
PY
(python3 /tmp/flip.py >/dev/null 2>&1 &) ; echo started"#;
    assert_eq!(sh(&b, &id, flipper).await.stdout, "started\n");
    for _ in 0..100 {
        if b.read_file(&id, "flipping", 0, None).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    b.read_file(&id, "flipping", 0, None)
        .await
        .expect("the flipper did not start");
    let (mut wrote, mut refusals, mut reads) = (0, 0, 0);
    // At least 300 rounds, and on until both sides of the race have been seen: on a loaded
    // machine the flipper may get no CPU for a while, and the swap then stands still.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut i = 0;
    while i < 300 || ((wrote == 0 || refusals == 0) && std::time::Instant::now() < deadline) {
        i += 1;
        match b
            .write_file(&id, &format!("d/{tag}-{i}"), b"x".to_vec(), false)
            .await
        {
            Ok(w) => {
                assert!(w.path.starts_with("/workspace/d/"));
                wrote += 1;
            }
            Err(e) => {
                assert!(e.is_caller_error(), "{e}");
                refusals += 1;
            }
        }
        match b.read_file(&id, "d/f", 0, None).await {
            Ok(r) => {
                assert_eq!(
                    r.data, b"inside\n",
                    "read something other than the sandbox's own file"
                );
                reads += 1;
            }
            Err(e) => assert!(e.is_caller_error(), "{e}"),
        }
        if let Ok(l) = b.list_files(&id, "d", false).await {
            let the_link_itself =
                l.entries.len() == 1 && l.entries[0].kind == runbox_core::FileKind::Symlink;
            assert!(
                the_link_itself
                    || l.entries
                        .iter()
                        .all(|e| e.path.starts_with("/workspace/d/")),
                "{l:?}"
            );
        }
    }
    // Both sides of the race were exercised.
    assert!(
        wrote > 0 && refusals > 0,
        "wrote {wrote}, refused {refusals}: the swap did not race"
    );
    eprintln!("swap race: {wrote} writes inside, {refusals} refused, {reads} reads");
    b.close(&id).await.unwrap();
    for dir in ["/", "/tmp", "/etc"] {
        let leaked = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&tag));
        assert!(!leaked, "a write escaped to the host's {dir}");
    }
}
