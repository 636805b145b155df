//! envd's messages in proto3 JSON, as Go's protojson writes them: lowerCamelCase names (the
//! original snake_case accepted too), zero values omitted, 64-bit integers as strings,
//! bytes as base64, enums as names (numbers accepted), unknown fields ignored.

use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};

// ---- process.Process ----

#[derive(Debug, Serialize)]
pub(crate) struct ProcessConfig<'a> {
    pub(crate) cmd: &'a str,
    pub(crate) args: Vec<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) envs: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cwd: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StartRequest<'a> {
    pub(crate) process: ProcessConfig<'a>,
    /// Explicit presence: sent even when false (stdin is /dev/null then).
    pub(crate) stdin: bool,
}

impl<'a> StartRequest<'a> {
    /// `command` run by a login bash (as the SDKs run commands), stdin closed.
    pub(crate) fn shell(
        command: &'a str,
        envs: &'a BTreeMap<String, String>,
        cwd: Option<&'a str>,
    ) -> Self {
        Self {
            process: ProcessConfig {
                cmd: "/bin/bash",
                args: vec!["-l", "-c", command],
                envs,
                cwd,
            },
            stdin: false,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct PidSelector {
    pub(crate) pid: u32,
}

#[derive(Debug, Serialize)]
pub(crate) struct SelectRequest {
    pub(crate) process: PidSelector,
}

#[derive(Debug, Serialize)]
pub(crate) struct SignalRequest {
    pub(crate) process: PidSelector,
    pub(crate) signal: &'static str,
}

/// One message of a `Start` or `Connect` stream.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ProcessStreamMessage {
    #[serde(default)]
    pub(crate) event: Option<ProcessEvent>,
}

/// A process event: exactly one of its fields is set (a oneof).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ProcessEvent {
    #[serde(default)]
    pub(crate) start: Option<StartEvent>,
    #[serde(default)]
    pub(crate) data: Option<DataEvent>,
    #[serde(default)]
    pub(crate) end: Option<EndEvent>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StartEvent {
    #[serde(default)]
    pub(crate) pid: u32,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DataEvent {
    #[serde(default, deserialize_with = "bytes")]
    pub(crate) stdout: Vec<u8>,
    #[serde(default, deserialize_with = "bytes")]
    pub(crate) stderr: Vec<u8>,
    #[serde(default, deserialize_with = "bytes")]
    pub(crate) pty: Vec<u8>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct EndEvent {
    #[serde(default, rename = "exitCode", alias = "exit_code")]
    pub(crate) exit_code: i32,
    #[serde(default)]
    pub(crate) exited: bool,
    /// Go's process state: `exit status 3`, `signal: killed`.
    #[serde(default)]
    pub(crate) status: String,
}

// ---- filesystem.Filesystem ----

#[derive(Debug, Serialize)]
pub(crate) struct PathRequest<'a> {
    pub(crate) path: &'a str,
}

#[derive(Debug, Serialize)]
pub(crate) struct ListDirRequest<'a> {
    pub(crate) path: &'a str,
    pub(crate) depth: u32,
}

#[derive(Debug, Deserialize)]
pub(crate) struct EntryResponse {
    pub(crate) entry: EntryInfo,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListDirResponse {
    #[serde(default)]
    pub(crate) entries: Vec<EntryInfo>,
}

/// What envd says of a file.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct EntryInfo {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default, rename = "type", deserialize_with = "file_type")]
    pub(crate) kind: FileType,
    #[serde(default)]
    pub(crate) path: String,
    #[serde(default, deserialize_with = "int64")]
    pub(crate) size: u64,
    #[serde(
        default,
        rename = "modifiedTime",
        alias = "modified_time",
        deserialize_with = "timestamp"
    )]
    pub(crate) modified_time: Option<SystemTime>,
    #[serde(default, rename = "symlinkTarget", alias = "symlink_target")]
    pub(crate) symlink_target: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum FileType {
    #[default]
    Unspecified,
    File,
    Directory,
    Symlink,
}

fn file_type<'de, D: Deserializer<'de>>(d: D) -> Result<FileType, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => match s.as_str() {
            "FILE_TYPE_FILE" => FileType::File,
            "FILE_TYPE_DIRECTORY" => FileType::Directory,
            "FILE_TYPE_SYMLINK" => FileType::Symlink,
            _ => FileType::Unspecified,
        },
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(1) => FileType::File,
            Some(2) => FileType::Directory,
            Some(3) => FileType::Symlink,
            _ => FileType::Unspecified,
        },
        _ => FileType::Unspecified,
    })
}

/// An int64 written as a string (proto3 JSON), or as a number.
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.trim().parse().map_err(D::Error::custom),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| D::Error::custom("a size must be a non-negative integer")),
        serde_json::Value::Null => Ok(0),
        other => Err(D::Error::custom(format!("not an int64: {other}"))),
    }
}

fn timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.and_then(|s| humantime::parse_rfc3339_weak(&s).ok()))
}

/// Bytes in base64: standard or URL-safe alphabet, padded or not.
fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    use serde::de::Error;
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(Vec::new());
    };
    decode_base64(&s).map_err(D::Error::custom)
}

pub(crate) fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::{DecodePaddingMode, general_purpose};
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, config);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, config);
    standard
        .decode(s)
        .or_else(|_| url_safe.decode(s))
        .or_else(|_| general_purpose::STANDARD.decode(s.replace(['\n', '\r'], "")))
        .map_err(|e| format!("bad base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_events_follow_proto3_json() {
        let m: ProcessStreamMessage =
            serde_json::from_str(r#"{"event":{"data":{"stdout":"aGkK"}}, "unknown": 1}"#).unwrap();
        assert_eq!(m.event.unwrap().data.unwrap().stdout, b"hi\n");
        // Zero values are omitted: no exitCode means 0, no exited means false.
        let m: ProcessStreamMessage =
            serde_json::from_str(r#"{"event":{"end":{"status":"exit status 0"}}}"#).unwrap();
        let end = m.event.unwrap().end.unwrap();
        assert_eq!((end.exit_code, end.exited), (0, false));
        let m: ProcessStreamMessage = serde_json::from_str(
            r#"{ "event" : { "end" : { "exit_code" : 3 , "exited" : true , "error" : "exit status 3" } } }"#,
        )
        .unwrap();
        assert_eq!(m.event.unwrap().end.unwrap().exit_code, 3);
        let m: ProcessStreamMessage =
            serde_json::from_str(r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#)
                .unwrap();
        assert_eq!(m.event.unwrap().end.unwrap().exit_code, -1);
        // URL-safe and unpadded base64 are accepted.
        assert_eq!(decode_base64("_-8").unwrap(), [0xff, 0xef]);
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
    }

    #[test]
    fn entries_take_sizes_as_strings_and_types_as_names_or_numbers() {
        let e: EntryInfo = serde_json::from_str(
            r#"{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"1234",
                "mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user",
                "modifiedTime":"2025-01-02T03:04:05.123456789Z","future":true}"#,
        )
        .unwrap();
        assert_eq!((e.kind, e.size), (FileType::File, 1234));
        let t = e.modified_time.unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_735_787_045
        );
        let d: EntryInfo = serde_json::from_str(r#"{"name":"d","type":2,"size":7}"#).unwrap();
        assert_eq!((d.kind, d.size), (FileType::Directory, 7));
        let empty: EntryInfo = serde_json::from_str("{}").unwrap();
        assert_eq!((empty.kind, empty.size), (FileType::Unspecified, 0));
        assert!(serde_json::from_str::<EntryInfo>(r#"{"size":"-1"}"#).is_err());
    }

    #[test]
    fn requests_are_lower_camel_with_explicit_stdin() {
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        let r = StartRequest {
            process: ProcessConfig {
                cmd: "/bin/bash",
                args: vec!["-l", "-c", "echo hi"],
                envs: &env,
                cwd: None,
            },
            stdin: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false}"#
        );
        let s = SignalRequest {
            process: PidSelector { pid: 9 },
            signal: "SIGNAL_SIGKILL",
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"process":{"pid":9},"signal":"SIGNAL_SIGKILL"}"#
        );
    }
}
