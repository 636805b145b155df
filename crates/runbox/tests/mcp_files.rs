//! Files, resources and the prompt through a real MCP client: `list_files`, `read_file` and
//! `write_file` (text, base64, parts, appends, images), every way out of the sandbox through
//! them refused with the host unchanged, the `sandbox://` template, resource links to the
//! files a run made, the operator's `--data-dir`, and `sandbox_instructions`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use base64::Engine;
use rmcp::ServiceError;
use rmcp::model::{ErrorCode, GetPromptRequestParams, ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};
use util::mcp::*;
use util::*;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn create(client: &Client) -> String {
    let r = call(client, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

/// A call that must fail; returns its message.
async fn refused(client: &Client, tool: &str, args: Value) -> String {
    let r = call(client, tool, args.clone()).await;
    assert!(is_error(&r), "{tool} {args} was not refused: {}", text(&r));
    text(&r)
}

async fn read(client: &Client, uri: &str) -> Result<ResourceContents, ServiceError> {
    let mut r = client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await?;
    assert_eq!(r.contents.len(), 1);
    Ok(r.contents.remove(0))
}

fn resource_text(c: &ResourceContents) -> &str {
    match c {
        ResourceContents::TextResourceContents { text, .. } => text,
        other => panic!("not text: {other:?}"),
    }
}

fn resource_blob(c: &ResourceContents) -> Vec<u8> {
    match c {
        ResourceContents::BlobResourceContents { blob, .. } => B64.decode(blob).unwrap(),
        other => panic!("not a blob: {other:?}"),
    }
}

fn error_code(e: ServiceError) -> (ErrorCode, String, Option<Value>) {
    match e {
        ServiceError::McpError(e) => (e.code, e.message.into_owned(), e.data),
        other => panic!("not a protocol error: {other}"),
    }
}

/// A 2×1 PNG, made by hand: signature, IHDR, IDAT, IEND.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAYAAAD0In+KAAAAEUlEQVR4nGP4z8DwHwQZGBgAHfMD/TpL7RMAAAAASUVORK5CYII=";

#[tokio::test]
async fn files_move_in_and_out_exactly() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--workspace-mb", "16"],
        Revision::Stateless,
    )
    .await;
    let id = create(&client).await;

    // Text, with parent folders created; relative paths start at /workspace.
    let r = call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "reports/2026/notes.md", "content": "# Notes\nété\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = structured(&r);
    assert_eq!(s["path"], "/workspace/reports/2026/notes.md");
    assert_eq!(s["size"], 14);
    assert_eq!(
        s["uri"],
        format!("sandbox://{id}/files/workspace/reports/2026/notes.md")
    );
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "/workspace/reports/2026/notes.md"}),
    )
    .await;
    assert_eq!(text(&r), "# Notes\nété\n");
    assert_eq!(structured(&r)["encoding"], "utf-8");
    assert_eq!(structured(&r)["mime_type"], "text/markdown");
    // Code in the sandbox sees the same file, and owns it.
    let r = call(&client, "run_command", json!({"sandbox_id": id, "command": "cat reports/2026/notes.md && echo more >> reports/2026/notes.md"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(
        structured(&r)["stdout"]
            .as_str()
            .unwrap()
            .starts_with("# Notes\nété\n")
    );

    // Binary, every byte value, exactly, both ways.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let r = call(&client, "write_file", json!({"sandbox_id": id, "path": "/tmp/blob.bin", "content": B64.encode(&bytes), "encoding": "base64"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&client, "run_code", json!({"sandbox_id": id, "code": "open('/tmp/blob.bin', 'rb').read() == (bytes(range(256)) * 300)[:70000]"})).await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "True",
        "{}",
        text(&r)
    );
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "/tmp/blob.bin"}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(s["encoding"], "base64", "binary falls back to base64");
    assert_eq!(B64.decode(s["content"].as_str().unwrap()).unwrap(), bytes);

    // A file the sandbox made, read in parts.
    call(&client, "run_code", json!({"sandbox_id": id, "code": "open('/workspace/big.txt','w').write('0123456789' * 1000)"})).await;
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "big.txt", "offset": 9995, "length": 10}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(
        (
            s["content"].as_str(),
            s["size"].as_i64(),
            s["more"].as_bool()
        ),
        (Some("56789"), Some(10000), Some(false))
    );
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "big.txt", "length": 4}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(
        (s["content"].as_str(), s["more"].as_bool()),
        (Some("0123"), Some(true))
    );
    assert!(text(&r).contains("offset 4"), "{}", text(&r));

    // Appending.
    for part in ["a", "b", "c"] {
        let r = call(
            &client,
            "write_file",
            json!({"sandbox_id": id, "path": "log.txt", "content": part, "append": true}),
        )
        .await;
        assert!(!is_error(&r), "{}", text(&r));
    }
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "log.txt"}),
    )
    .await;
    assert_eq!(text(&r), "abc");

    // An image comes back as an image too.
    call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "dot.png", "content": PNG, "encoding": "base64"}),
    )
    .await;
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "dot.png"}),
    )
    .await;
    let image = r
        .content
        .iter()
        .find_map(|c| c.as_image())
        .expect("an image block");
    assert_eq!(
        (image.mime_type.as_str(), image.data.as_str()),
        ("image/png", PNG)
    );

    // Listings: kinds, sizes, times, recursion; symlinks reported, not followed.
    call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "ln -s / /workspace/root-link"}),
    )
    .await;
    let r = call(&client, "list_files", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let entries = structured(&r)["entries"].as_array().unwrap().clone();
    let find = |name: &str| entries.iter().find(|e| e["name"] == name).cloned();
    assert_eq!(find("reports").unwrap()["type"], "directory");
    assert_eq!(find("big.txt").unwrap()["size"], 10000);
    assert_eq!(find("root-link").unwrap()["type"], "symlink");
    assert!(find("notes.md").is_none(), "not recursive by default");
    assert!(
        find("big.txt").unwrap()["modified"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let r = call(
        &client,
        "list_files",
        json!({"sandbox_id": id, "recursive": true}),
    )
    .await;
    let paths: Vec<String> = structured(&r)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        paths.contains(&"/workspace/reports/2026/notes.md".to_owned()),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.starts_with("/workspace/root-link/")),
        "a symlink was followed: {paths:?}"
    );
    let r = call(
        &client,
        "list_files",
        json!({"sandbox_id": id, "path": "/tmp"}),
    )
    .await;
    assert!(text(&r).contains("/tmp/blob.bin"), "{}", text(&r));

    // Errors say what is wrong.
    let m = refused(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "missing.txt"}),
    )
    .await;
    assert!(m.contains("no such file"), "{m}");
    let m = refused(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "reports"}),
    )
    .await;
    assert!(m.contains("directory"), "{m}");
    let m = refused(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "/tmp/blob.bin", "encoding": "utf-8"}),
    )
    .await;
    assert!(m.contains("base64"), "{m}");
    let m = refused(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "x.bin", "content": "not base64!", "encoding": "base64"}),
    )
    .await;
    assert!(m.contains("base64"), "{m}");
    let m = refused(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "big.txt", "offset": -1}),
    )
    .await;
    assert!(m.contains("offset"), "{m}");
    // A length over the maximum reads the maximum.
    let r = call(
        &client,
        "read_file",
        json!({"sandbox_id": id, "path": "big.txt", "length": 100_000_000}),
    )
    .await;
    assert_eq!(structured(&r)["length"], 10000, "{}", text(&r));
    // A write over the maximum is refused with what to do instead.
    let m = refused(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "huge.bin", "content": B64.encode(vec![1u8; 17 << 20]), "encoding": "base64"}),
    )
    .await;
    assert!(m.contains("append"), "{m}");
    let m = refused(&client, "list_files", json!({"sandbox_id": "sbx_never"})).await;
    assert!(
        m.contains("sbx_never") && m.contains("create_sandbox"),
        "{m}"
    );
    // A full disk is a limit error, not a crash, and the sandbox goes on.
    let big = B64.encode(vec![7u8; 4 << 20]);
    let mut last = String::new();
    for i in 0..8 {
        let r = call(&client, "write_file", json!({"sandbox_id": id, "path": format!("fill/{i}.bin"), "content": big, "encoding": "base64"})).await;
        if is_error(&r) {
            last = text(&r);
            break;
        }
    }
    assert!(
        last.contains("no space left"),
        "the disk never filled: {last}"
    );
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "rm -rf /workspace/fill && echo ok"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "ok\n");
    client.cancel().await.unwrap();
}

/// Every way out through the file tools is refused, and the host is left as it was.
#[tokio::test]
async fn file_tools_cannot_reach_the_host() {
    let host_dir = tempfile::tempdir().unwrap();
    let secret = canary("file-tools");
    let secret_path = host_dir.path().join("secret.txt");
    std::fs::write(&secret_path, &secret).unwrap();
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Legacy).await;
    let id = create(&client).await;
    let setup = format!(
        "set -e; cd /workspace; ln -s {secret} abs-link; ln -s ../../../../../../etc up-link; \
         ln -s /proc/1/root proc-link; mkdir d; ln -s /etc d/etc-link; ln -s / root-link; \
         mkfifo fifo; echo ok",
        secret = secret_path.display()
    );
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": setup}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "ok\n", "{}", text(&r));

    let mut answers = Vec::new();
    for path in [
        "../etc/passwd",
        "/workspace/../etc/passwd",
        "/workspace/./../../etc/passwd",
        "/etc/passwd",
        "//etc/passwd",
        "/tmp/../etc/passwd",
        "/proc/self/environ",
        "/proc/1/root/etc/passwd",
        "/sys/kernel/hostname",
        "abs-link",
        "up-link/passwd",
        "proc-link/etc/passwd",
        "d/etc-link/passwd",
        "root-link/etc/passwd",
        "fifo",
        secret_path.to_str().unwrap(),
    ] {
        answers.push(
            refused(
                &client,
                "read_file",
                json!({"sandbox_id": id, "path": path}),
            )
            .await,
        );
    }
    for path in [
        "../evil",
        "/evil",
        "/etc/evil.conf",
        "up-link/evil.conf",
        "d/etc-link/evil.conf",
        "root-link/evil",
        "proc-link/evil",
        "abs-link",
        "/proc/sys/kernel/hostname",
    ] {
        answers.push(
            refused(
                &client,
                "write_file",
                json!({"sandbox_id": id, "path": path, "content": "pwned"}),
            )
            .await,
        );
    }
    for path in [
        "/",
        "/etc",
        "/proc",
        "..",
        "up-link/..",
        "/workspace/../etc",
    ] {
        answers.push(
            refused(
                &client,
                "list_files",
                json!({"sandbox_id": id, "path": path}),
            )
            .await,
        );
    }
    // Listing a symlink reports it and does not follow it.
    for path in ["up-link", "root-link", "d/etc-link"] {
        let r = call(
            &client,
            "list_files",
            json!({"sandbox_id": id, "path": path}),
        )
        .await;
        let entries = structured(&r)["entries"].as_array().unwrap().clone();
        assert_eq!(entries.len(), 1, "{path}: {}", text(&r));
        assert_eq!(entries[0]["type"], "symlink");
        answers.push(text(&r));
    }
    let r = call(
        &client,
        "list_files",
        json!({"sandbox_id": id, "recursive": true}),
    )
    .await;
    answers.push(text(&r));
    assert!(!text(&r).contains("passwd"), "{}", text(&r));

    for answer in &answers {
        assert!(
            !answer.contains(&secret),
            "the host's secret leaked: {answer}"
        );
        assert!(
            !answer.contains("root:x:0:0"),
            "the host's passwd leaked: {answer}"
        );
    }
    assert_eq!(std::fs::read_to_string(&secret_path).unwrap(), secret);
    assert_eq!(std::fs::read_to_string("/etc/passwd").unwrap(), host_passwd);
    for p in ["/evil", "/etc/evil.conf", "/root/evil"] {
        assert!(
            !std::path::Path::new(p).exists(),
            "{p} was created on the host"
        );
    }
    assert_eq!(std::fs::read_dir(host_dir.path()).unwrap().count(), 1);
    client.cancel().await.unwrap();
}

/// A data directory as an operator would lay it out, readable by the sandboxes.
fn data_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.path().join("sales.csv"),
        "region,amount\nnorth,10\nsouth,32\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("logo.png"), B64.decode(PNG).unwrap()).unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::set_permissions(
        dir.path().join("docs"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(dir.path().join("docs/readme.md"), "# Sales data\n").unwrap();
    dir
}

async fn resources_flow(client: &Client, revision: Revision) {
    // The operator's data files.
    let resources = client.list_all_resources().await.unwrap();
    let names: Vec<&str> = resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["docs/readme", "logo", "sales"]);
    let sales = resources.iter().find(|r| r.name == "sales").unwrap();
    assert_eq!(sales.uri, "data://sales");
    assert_eq!(sales.mime_type.as_deref(), Some("text/csv"));
    assert_eq!(sales.size, Some(32));
    let c = read(client, "data://sales").await.unwrap();
    assert!(resource_text(&c).starts_with("region,amount\n"));
    let c = read(client, "data://logo").await.unwrap();
    assert_eq!(resource_blob(&c), B64.decode(PNG).unwrap());
    assert_eq!(
        resource_text(&read(client, "data://docs/readme").await.unwrap()),
        "# Sales data\n"
    );
    let (code, message, data) = error_code(read(client, "data://nope").await.unwrap_err());
    let not_found = match revision {
        Revision::Legacy => ErrorCode::RESOURCE_NOT_FOUND,
        Revision::Stateless => ErrorCode::INVALID_PARAMS,
    };
    assert_eq!(code, not_found, "{message}");
    assert_eq!(data.unwrap()["uri"], "data://nope");

    let templates = client.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(
        templates[0].uri_template,
        "sandbox://{sandbox_id}/files/{path}"
    );

    // The same files in every sandbox, read-only.
    let id = create(client).await;
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": "import csv\nrows = list(csv.DictReader(open('/data/sales.csv')))\nsum(int(r['amount']) for r in rows)"})).await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "42",
        "{}",
        text(&r)
    );
    assert!(
        structured(&r)["files"].as_array().unwrap().is_empty(),
        "nothing was written"
    );
    assert!(r.content.iter().all(|c| c.as_resource_link().is_none()));
    let r = call(
        client,
        "run_command",
        json!({"sandbox_id": id, "command": "touch /data/x"}),
    )
    .await;
    assert!(
        is_error(&r) && text(&r).contains("Read-only"),
        "{}",
        text(&r)
    );
    let r = call(
        client,
        "list_files",
        json!({"sandbox_id": id, "path": "/data", "recursive": true}),
    )
    .await;
    assert!(text(&r).contains("/data/docs/readme.md"), "{}", text(&r));
    let r = call(
        client,
        "read_file",
        json!({"sandbox_id": id, "path": "/data/sales.csv"}),
    )
    .await;
    assert!(text(&r).contains("south,32"), "{}", text(&r));
    let m = refused(
        client,
        "write_file",
        json!({"sandbox_id": id, "path": "/data/sales.csv", "content": "x"}),
    )
    .await;
    assert!(m.contains("read-only"), "{m}");

    // Files a run creates or changes come back as links that resources/read follows.
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": "import os\nos.makedirs('out dir', exist_ok=True)\nopen('out dir/summary.txt', 'w').write('total 42')\nopen('/tmp/scratch', 'w').write('not linked')\nimport shutil\nshutil.copy('/data/logo.png', 'logo.png')"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let links: Vec<_> = r
        .content
        .iter()
        .filter_map(|c| c.as_resource_link())
        .collect();
    let uris: Vec<&str> = links.iter().map(|l| l.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            format!("sandbox://{id}/files/workspace/logo.png"),
            format!("sandbox://{id}/files/workspace/out%20dir/summary.txt"),
        ]
    );
    assert_eq!(links[0].mime_type.as_deref(), Some("image/png"));
    assert_eq!(links[1].size, Some(8));
    assert!(
        text(&r).contains("/workspace/out dir/summary.txt (8 bytes)"),
        "{}",
        text(&r)
    );
    assert_eq!(
        structured(&r)["files"][1]["path"],
        "/workspace/out dir/summary.txt"
    );
    assert_eq!(
        resource_text(&read(client, uris[1]).await.unwrap()),
        "total 42"
    );
    assert_eq!(
        resource_blob(&read(client, uris[0]).await.unwrap()),
        B64.decode(PNG).unwrap()
    );
    // The template's expansion encodes slashes; that reads the same file.
    let encoded = format!("sandbox://{id}/files/workspace%2Fout%20dir%2Fsummary.txt");
    assert_eq!(
        resource_text(&read(client, &encoded).await.unwrap()),
        "total 42"
    );
    // Changing a file links it again; an untouched one is not.
    let r = call(
        client,
        "run_command",
        json!({"sandbox_id": id, "command": "echo ' and more' >> 'out dir/summary.txt'"}),
    )
    .await;
    let links: Vec<_> = r
        .content
        .iter()
        .filter_map(|c| c.as_resource_link())
        .collect();
    assert_eq!(links.len(), 1, "{:?}", r.content);
    assert!(links[0].uri.ends_with("summary.txt"));

    // Sandbox resources stay inside the sandbox, and unknown ones are not found.
    let (code, message, _) = error_code(
        read(client, &format!("sandbox://{id}/files/etc/passwd"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ErrorCode::INVALID_PARAMS);
    assert!(
        message.contains("outside") && !message.contains("root:x"),
        "{message}"
    );
    let (code, _, data) = error_code(
        read(client, "sandbox://sbx_never/files/workspace/a")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, not_found);
    assert_eq!(
        data.unwrap()["uri"],
        "sandbox://sbx_never/files/workspace/a"
    );
    let (code, _, _) = error_code(
        read(client, &format!("sandbox://{id}/files/workspace/missing"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, not_found);
    let (code, message, data) = error_code(read(client, "ftp://elsewhere/x").await.unwrap_err());
    assert_eq!(code, not_found);
    assert_eq!(data.unwrap()["uri"], "ftp://elsewhere/x");
    assert!(message.contains("sandbox://"), "{message}");

    // The prompt.
    let prompts = client.list_all_prompts().await.unwrap();
    assert_eq!(prompts.len(), 1);
    assert_eq!(prompts[0].name, "sandbox_instructions");
    let p = client
        .get_prompt(GetPromptRequestParams::new("sandbox_instructions"))
        .await
        .unwrap();
    let body = p.messages[0].content.as_text().unwrap().text.clone();
    for needle in [
        "create_sandbox",
        "close_sandbox",
        "write_file",
        "/data/sales.csv",
        "/data/docs/readme.md",
    ] {
        assert!(
            body.contains(needle),
            "{needle} missing from the prompt: {body}"
        );
    }
    assert!(
        client
            .get_prompt(GetPromptRequestParams::new("nope"))
            .await
            .is_err()
    );
    call(client, "close_sandbox", json!({"sandbox_id": id})).await;
}

#[tokio::test]
async fn resources_links_data_and_the_prompt_over_stdio() {
    let data = data_dir();
    let dir = data.path().to_str().unwrap();
    let (client, _) = stdio_client(&["--pool", "0", "--data-dir", dir], Revision::Legacy).await;
    resources_flow(&client, Revision::Legacy).await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn resources_links_data_and_the_prompt_over_http() {
    let data = data_dir();
    let dir = data.path().to_str().unwrap();
    let server = HttpServer::start(&["--pool", "0", "--data-dir", dir]).await;
    let (client, _) = server.client(Revision::Stateless).await;
    resources_flow(&client, Revision::Stateless).await;
    client.cancel().await.unwrap();
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn without_a_data_dir_there_are_no_data_resources() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    assert!(client.list_all_resources().await.unwrap().is_empty());
    let (code, message, _) = error_code(read(&client, "data://sales").await.unwrap_err());
    assert_eq!(code, ErrorCode::INVALID_PARAMS);
    assert!(message.contains("no data directory"), "{message}");
    let id = create(&client).await;
    let m = refused(
        &client,
        "list_files",
        json!({"sandbox_id": id, "path": "/data"}),
    )
    .await;
    assert!(m.contains("outside"), "{m}");
    client.cancel().await.unwrap();
}

/// Sandboxed code chooses its files' times: ones RFC 3339 cannot write (before 1970, after
/// the year 9999) are listed clamped, and never take the server down (found by fuzzing).
#[tokio::test]
async fn file_times_sandboxed_code_chose_are_listed_without_failing() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    let id = create(&client).await;
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": "touch -d @253402300800 /workspace/future && touch -d 1960-01-01 /workspace/past"}),
    )
    .await;
    assert_eq!(structured(&r)["exit_code"], 0, "{}", text(&r));
    let r = call(&client, "list_files", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let entries = structured(&r)["entries"].as_array().unwrap().clone();
    let modified = |name: &str| {
        entries
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {entries:?}"))["modified"]
            .clone()
    };
    assert_eq!(modified("future"), "9999-12-31T23:59:59.999Z");
    assert_eq!(modified("past"), "1970-01-01T00:00:00.000Z");
    // The server is still there.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "6 * 7"}),
    )
    .await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    client.cancel().await.unwrap();
}
