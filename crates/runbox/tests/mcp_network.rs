//! Network access through the egress proxy, through a real MCP client against `runbox serve`
//! with real sandboxes: none by default, real package installs from the host's configured
//! indexes, hosts off the list refused, the host's loopback never reached, and package names
//! that are shell text or options never run as such.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};
use util::mcp::*;

async fn create(client: &Client, args: Value) -> Result<Value, String> {
    let r = call(client, "create_sandbox", args).await;
    if is_error(&r) {
        Err(text(&r))
    } else {
        Ok(structured(&r))
    }
}

async fn python(client: &Client, id: &str, code: &str) -> Value {
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "code": code, "timeout_seconds": 60}),
    )
    .await;
    structured(&r)
}

fn value(v: &Value) -> String {
    v["results"][0]["data"]["text/plain"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sends one raw request head to the sandbox's proxy (bypassing NO_PROXY, which keeps
/// loopback destinations local); the status line of its answer.
const RAW: &str = "import os, socket
def raw(head):
    proxy = os.environ['HTTP_PROXY'].rsplit(':', 1)
    s = socket.create_connection((proxy[0].split('//')[1], int(proxy[1])), timeout=20)
    s.sendall(head.encode() + b'\\r\\n\\r\\n')
    return s.recv(4096).split(b'\\r\\n')[0].decode()
";

/// Fetches `url` through the sandbox's proxy; the HTTP status, or the error's text.
const FETCH: &str = "import urllib.request, urllib.error
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=20).status
    except urllib.error.HTTPError as e:
        return f'{e.code} {e.read().decode()[:300]}'
    except Exception as e:
        return f'{type(e).__name__}: {e}'
";

#[tokio::test]
async fn packages_install_through_the_allowlist_and_nothing_else_goes_out() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;

    // No network by default: no proxy, and installing says how to get one.
    let plain = create(&client, json!({})).await.unwrap();
    assert_eq!(plain["network"], "none");
    let id = plain["sandbox_id"].as_str().unwrap();
    let o = python(&client, id, "import os, socket\ns = socket.socket()\ns.settimeout(2)\n(os.environ.get('HTTPS_PROXY'), s.connect_ex(('127.0.0.1', 3128)) != 0)").await;
    assert_eq!(value(&o), "(None, True)", "{o}");
    let r = call(
        &client,
        "install_packages",
        json!({"sandbox_id": id, "packages": ["tabulate"]}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("network: \"allowlist\""), "{}", text(&r));

    // Asking for a host the operator did not allow is an error.
    let e = create(
        &client,
        json!({"network": "allowlist", "allow_hosts": ["not-allowed.example"]}),
    )
    .await
    .unwrap_err();
    assert!(e.contains("not-allowed.example"), "{e}");

    let net = create(&client, json!({"network": "allowlist"}))
        .await
        .unwrap();
    assert_eq!(net["network"], "allowlist");
    assert!(
        !net["allowed_hosts"].as_array().unwrap().is_empty(),
        "{net}"
    );
    let id = net["sandbox_id"].as_str().unwrap();

    // A real pip install from the index the host's pip uses, importable at once.
    let o = python(
        &client,
        id,
        "import importlib.util\nimportlib.util.find_spec('tabulate') is None",
    )
    .await;
    assert_eq!(value(&o), "True", "tabulate is already importable: {o}");
    let r = call(
        &client,
        "install_packages",
        json!({"sandbox_id": id, "packages": ["tabulate"], "timeout_seconds": 240}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["exit_code"], 0);
    let o = python(&client, id, "import tabulate\n(tabulate.__file__.startswith('/workspace/.packages/python/'), tabulate.tabulate([[1, 2]]).split())").await;
    assert_eq!(value(&o), "(True, ['-', '-', '1', '2', '-', '-'])", "{o}");
    // ... and by python3 in a command.
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "python3 -c 'import tabulate; print(tabulate.__name__)'"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "tabulate\n", "{}", text(&r));

    // A real npm install, requirable from the JavaScript kernel.
    let r = call(
        &client,
        "install_packages",
        json!({"sandbox_id": id, "packages": ["is-number@7"], "manager": "npm", "timeout_seconds": 240}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "language": "javascript", "code": "const isNumber = require('is-number');\n[isNumber(5), isNumber('x'), require.resolve('is-number').startsWith('/workspace/node_modules/')]"}),
    )
    .await;
    assert_eq!(
        value(&structured(&r)),
        "[ true, false, true ]",
        "{}",
        text(&r)
    );

    // Package names are arguments, never shell text, and never options.
    let r = call(
        &client,
        "install_packages",
        json!({"sandbox_id": id, "packages": ["tabulate; touch /workspace/pwned1", "$(touch /workspace/pwned2)", "`touch /workspace/pwned3`"]}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert_ne!(structured(&r)["exit_code"], 0);
    for opt in [
        "--index-url=http://attacker.example/simple",
        "-r/etc/passwd",
    ] {
        let r = call(
            &client,
            "install_packages",
            json!({"sandbox_id": id, "packages": [opt]}),
        )
        .await;
        assert!(is_error(&r) && text(&r).contains("option"), "{}", text(&r));
    }
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "ls /workspace"}),
    )
    .await;
    assert!(
        !structured(&r)["stdout"].as_str().unwrap().contains("pwned"),
        "{}",
        text(&r)
    );

    // Hosts off the list are refused by the proxy, before any lookup.
    let o = python(
        &client,
        id,
        &format!(
            "{FETCH}fetch('http://off-the-list.example/'), fetch('https://off-the-list.example/')"
        ),
    )
    .await;
    let v = value(&o);
    assert!(
        v.contains("403") && v.contains("off-the-list.example"),
        "{o}"
    );
    // Direct connections, around the proxy, go nowhere.
    let o = python(
        &client,
        id,
        "import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect_ex(('1.1.1.1', 443))",
    )
    .await;
    assert_ne!(value(&o), "0", "{o}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_hosts_loopback_is_never_reached_even_when_listed() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let hosts = format!("127.0.0.1:{port},localhost:{port},metadata.test:{port}");
    let server = HttpServer::start(&["--pool", "0", "--allow-host", &hosts]).await;
    let (client, _) = server.client(Revision::Legacy).await;
    let net = create(&client, json!({"network": "allowlist"}))
        .await
        .unwrap();
    let id = net["sandbox_id"].as_str().unwrap();
    let o = python(
        &client,
        id,
        &format!(
            "{RAW}[raw('CONNECT 127.0.0.1:{port} HTTP/1.1'), raw('CONNECT localhost:{port} HTTP/1.1'), \
             raw('GET http://localhost:{port}/ HTTP/1.1'), raw('CONNECT [::ffff:127.0.0.1]:{port} HTTP/1.1'), \
             raw('CONNECT [::1]:{port} HTTP/1.1'), raw('GET http://127.0.0.1:{port}/ HTTP/1.1')]"
        ),
    )
    .await;
    let v = value(&o);
    assert_eq!(v.matches("403").count(), 6, "{o}");
    // Nothing arrived at the host's listener.
    std::thread::sleep(Duration::from_millis(200));
    match listener.accept() {
        Ok((mut s, peer)) => {
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf);
            panic!("the host's loopback listener was reached from {peer}: {buf:?}");
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
    // Each refusal is counted in the metrics, by reason.
    let metrics = server.metrics().await;
    // ([::ffff:127.0.0.1] is not on the list, the five others resolve to loopback.)
    for line in [
        "runbox_egress_decisions_total{decision=\"address_refused\"} 5",
        "runbox_egress_decisions_total{decision=\"host_not_allowed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing: {metrics}");
    }
    assert!(!metrics.contains("decision=\"allowed\""), "{metrics}");
    // No host: no sandbox gets a network.
    client.cancel().await.unwrap();
    server.stop().await;
    let (client, _) =
        stdio_client(&["--pool", "0", "--allow-host", "none"], Revision::Legacy).await;
    let e = create(&client, json!({"network": "allowlist"}))
        .await
        .unwrap_err();
    assert!(e.contains("--allow-host"), "{e}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn stdio_answers_before_the_package_indexes_are_found() {
    // An `npm` that, asked for its registry, waits until the test lets it answer.
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = dir.path().join("npm-started");
    let npm = dir.path().join("npm");
    std::fs::write(
        &npm,
        format!(
            "#!/bin/sh\ntouch '{}'\ncat '{}' >/dev/null\necho https://registry.test.invalid/\n",
            started.display(),
            gate.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&npm, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = serve_command(&["--stdio", "--pool", "0"]);
    command.env("PATH", path);
    let transport = rmcp::transport::TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap()
        .0;

    // The lookup cannot finish (npm waits for the gate), and initialize is answered: well
    // within the 30 s a lookup may take before it is given up.
    use rmcp::service::ClientServiceExt;
    let client = tokio::time::timeout(
        Duration::from_secs(20),
        Recorder::default().serve_with_lifecycle(transport, lifecycle(Revision::Legacy)),
    )
    .await
    .expect("initialize waited for the package-index lookup")
    .unwrap();
    assert!(
        !started.exists(),
        "the indexes were looked up before anything needed them"
    );

    // The first sandbox that asks for a network starts the lookup and gets its hosts.
    let release = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(60), async {
            while !started.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("npm was never asked");
        tokio::task::spawn_blocking(move || std::fs::write(&gate, b"go").unwrap())
            .await
            .unwrap();
    });
    let created = create(&client, json!({"network": "allowlist"}))
        .await
        .unwrap();
    release.await.unwrap();
    let hosts = created["allowed_hosts"].to_string();
    assert!(hosts.contains("registry.test.invalid"), "{created}");
    client.cancel().await.unwrap();
}
