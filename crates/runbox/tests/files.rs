//! The file operations of the local backend: what list, read and write do in a real
//! sandbox. The ways out through them are in `escape.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use runbox_core::{Backend, Error, FileKind};
use util::*;

fn random_bytes(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b
}

#[tokio::test]
async fn binary_files_round_trip_exactly() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let data = random_bytes(3 << 20);
    let w = b
        .write_file(&id, "/workspace/data/blob.bin", data.clone(), false)
        .await
        .unwrap();
    assert_eq!(w.path, "/workspace/data/blob.bin");
    assert_eq!(w.size, data.len() as u64);
    let r = b.read_file(&id, "data/blob.bin", 0, None).await.unwrap();
    assert_eq!(r.size, data.len() as u64);
    assert!(r.data == data, "bytes differ after a round trip");
    // The sandbox sees the same bytes the server wrote.
    let o = sh(
        &b,
        &id,
        "sha256sum /workspace/data/blob.bin | cut -d' ' -f1",
    )
    .await;
    let host = {
        let p = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        p.stdin.as_ref().unwrap().write_all(&data).unwrap();
        let out = p.wait_with_output().unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(o.stdout.trim(), host);
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn reads_in_parts_and_appends() {
    let b = backend().await;
    let id = sandbox(&b).await;
    b.write_file(&id, "notes.txt", b"hello ".to_vec(), false)
        .await
        .unwrap();
    let w = b
        .write_file(&id, "notes.txt", b"world\n".to_vec(), true)
        .await
        .unwrap();
    assert_eq!(w.size, 12);
    let r = b
        .read_file(&id, "/workspace/notes.txt", 6, Some(5))
        .await
        .unwrap();
    assert_eq!(r.data, b"world");
    assert_eq!((r.offset, r.size), (6, 12));
    assert!(r.more());
    let r = b.read_file(&id, "notes.txt", 100, None).await.unwrap();
    assert!(r.data.is_empty() && !r.more());
    // The sandbox's code sees the file and owns it: it can change and remove it.
    let o = sh(
        &b,
        &id,
        "cat notes.txt && echo extra >> notes.txt && rm -r /workspace/notes.txt && echo removed",
    )
    .await;
    assert_eq!(o.stdout, "hello world\nremoved\n", "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn listings_report_kind_size_and_time() {
    let b = backend().await;
    let id = sandbox(&b).await;
    sh(&b, &id, "mkdir -p proj/src && printf 12345 > proj/src/a.py && ln -s src/a.py proj/link && mkfifo proj/pipe").await;
    let flat = b.list_files(&id, "/workspace/proj", false).await.unwrap();
    let names: Vec<(&str, FileKind)> = flat
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("link", FileKind::Symlink),
            ("pipe", FileKind::Other),
            ("src", FileKind::Directory)
        ]
    );
    let deep = b.list_files(&id, "proj", true).await.unwrap();
    let file = deep
        .entries
        .iter()
        .find(|e| e.path == "/workspace/proj/src/a.py")
        .expect("recursive entry");
    assert_eq!(file.kind, FileKind::File);
    assert_eq!(file.size, 5);
    let age = std::time::SystemTime::now()
        .duration_since(file.modified)
        .unwrap();
    assert!(age.as_secs() < 120, "{age:?}");
    assert!(!deep.truncated);
    // /tmp is reachable too; a single file lists as itself.
    b.write_file(&id, "/tmp/x.txt", b"x".to_vec(), false)
        .await
        .unwrap();
    let one = b.list_files(&id, "/tmp/x.txt", false).await.unwrap();
    assert_eq!(one.entries.len(), 1);
    assert_eq!(one.entries[0].path, "/tmp/x.txt");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn errors_say_what_is_wrong() {
    let b = backend().await;
    let id = sandbox(&b).await;
    sh(&b, &id, "mkdir /workspace/dir && mkfifo /workspace/fifo").await;
    let msg = |e: Error| {
        assert!(e.is_caller_error(), "{e}");
        e.to_string()
    };
    assert!(
        msg(b.read_file(&id, "missing.txt", 0, None).await.unwrap_err()).contains("no such file")
    );
    assert!(msg(b.read_file(&id, "dir", 0, None).await.unwrap_err()).contains("list_files"));
    // A FIFO is refused at once rather than blocking the server.
    assert!(
        msg(b.read_file(&id, "fifo", 0, None).await.unwrap_err()).contains("not a regular file")
    );
    assert!(msg(b.read_file(&id, "x", 0, Some(64 << 20)).await.unwrap_err()).contains("in parts"));
    assert!(
        msg(b
            .write_file(&id, "big", vec![0; 40 << 20], false)
            .await
            .unwrap_err())
        .contains("in parts")
    );
    assert!(
        msg(b
            .write_file(&id, "/workspace/", b"x".to_vec(), false)
            .await
            .unwrap_err())
        .contains("directory")
    );
    assert!(msg(b.list_files(&id, "/etc", false).await.unwrap_err()).contains("outside"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn a_full_workspace_is_a_limit_error() {
    let b = backend().await;
    let id = sandbox_with(
        &b,
        runbox_core::Limits {
            workspace_mb: 4,
            ..Default::default()
        },
    )
    .await;
    let e = b
        .write_file(&id, "fill.bin", vec![7u8; 8 << 20], false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LimitReached(_)), "{e}");
    assert!(e.to_string().contains("no space left"), "{e}");
    b.close(&id).await.unwrap();
}
