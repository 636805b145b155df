//! proto3-JSON validation of envd request messages (`process.proto`, `filesystem.proto`).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::Value;

#[derive(Clone, Copy)]
pub(crate) enum Ty {
    Str,
    Bool,
    U32,
    Bytes,
    StrList,
    StrMap,
    Signal,
    Msg(&'static Msg),
}

pub(crate) struct Msg {
    pub name: &'static str,
    pub fields: &'static [(&'static str, Ty)],
    /// Fields a sensible request must set (proto3 has no `required`; missing ones are
    /// reported as violations, not gross ones).
    pub required: &'static [&'static str],
    /// A oneof of which exactly one member must be set.
    pub oneof: &'static [&'static str],
}

/// A problem with a message: `gross` when the server could not even decode it.
pub(crate) struct Problem {
    pub gross: bool,
    pub text: String,
}

static PTY_SIZE: Msg = Msg {
    name: "PTY.Size",
    fields: &[("cols", Ty::U32), ("rows", Ty::U32)],
    required: &[],
    oneof: &[],
};
static PTY: Msg = Msg {
    name: "PTY",
    fields: &[("size", Ty::Msg(&PTY_SIZE))],
    required: &[],
    oneof: &[],
};
static PROCESS_CONFIG: Msg = Msg {
    name: "ProcessConfig",
    fields: &[
        ("cmd", Ty::Str),
        ("args", Ty::StrList),
        ("envs", Ty::StrMap),
        ("cwd", Ty::Str),
    ],
    required: &["cmd"],
    oneof: &[],
};
static SELECTOR: Msg = Msg {
    name: "ProcessSelector",
    fields: &[("pid", Ty::U32), ("tag", Ty::Str)],
    required: &[],
    oneof: &["pid", "tag"],
};
static PROCESS_INPUT: Msg = Msg {
    name: "ProcessInput",
    fields: &[("stdin", Ty::Bytes), ("pty", Ty::Bytes)],
    required: &[],
    oneof: &["stdin", "pty"],
};
static START: Msg = Msg {
    name: "StartRequest",
    fields: &[
        ("process", Ty::Msg(&PROCESS_CONFIG)),
        ("pty", Ty::Msg(&PTY)),
        ("tag", Ty::Str),
        ("stdin", Ty::Bool),
    ],
    required: &["process"],
    oneof: &[],
};
static CONNECT: Msg = Msg {
    name: "ConnectRequest",
    fields: &[("process", Ty::Msg(&SELECTOR))],
    required: &["process"],
    oneof: &[],
};
static LIST: Msg = Msg {
    name: "ListRequest",
    fields: &[],
    required: &[],
    oneof: &[],
};
static SEND_INPUT: Msg = Msg {
    name: "SendInputRequest",
    fields: &[
        ("process", Ty::Msg(&SELECTOR)),
        ("input", Ty::Msg(&PROCESS_INPUT)),
    ],
    required: &["process", "input"],
    oneof: &[],
};
static SEND_SIGNAL: Msg = Msg {
    name: "SendSignalRequest",
    fields: &[("process", Ty::Msg(&SELECTOR)), ("signal", Ty::Signal)],
    required: &["process", "signal"],
    oneof: &[],
};
static CLOSE_STDIN: Msg = Msg {
    name: "CloseStdinRequest",
    fields: &[("process", Ty::Msg(&SELECTOR))],
    required: &["process"],
    oneof: &[],
};
static UPDATE: Msg = Msg {
    name: "UpdateRequest",
    fields: &[("process", Ty::Msg(&SELECTOR)), ("pty", Ty::Msg(&PTY))],
    required: &["process"],
    oneof: &[],
};
static PATH_ONLY: Msg = Msg {
    name: "path request",
    fields: &[("path", Ty::Str)],
    required: &["path"],
    oneof: &[],
};
static LIST_DIR: Msg = Msg {
    name: "ListDirRequest",
    fields: &[("path", Ty::Str), ("depth", Ty::U32)],
    required: &["path"],
    oneof: &[],
};
static MOVE: Msg = Msg {
    name: "MoveRequest",
    fields: &[("source", Ty::Str), ("destination", Ty::Str)],
    required: &["source", "destination"],
    oneof: &[],
};

/// The RPC methods the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rpc {
    Start,
    Connect,
    List,
    SendInput,
    SendSignal,
    CloseStdin,
    Update,
    Stat,
    ListDir,
    MakeDir,
    Move,
    Remove,
}

impl Rpc {
    /// `path` is `/{package}.{Service}/{Method}`.
    pub fn from_path(path: &str) -> Option<Rpc> {
        Some(match path {
            "/process.Process/Start" => Rpc::Start,
            "/process.Process/Connect" => Rpc::Connect,
            "/process.Process/List" => Rpc::List,
            "/process.Process/SendInput" => Rpc::SendInput,
            "/process.Process/SendSignal" => Rpc::SendSignal,
            "/process.Process/CloseStdin" => Rpc::CloseStdin,
            "/process.Process/Update" => Rpc::Update,
            "/filesystem.Filesystem/Stat" => Rpc::Stat,
            "/filesystem.Filesystem/ListDir" => Rpc::ListDir,
            "/filesystem.Filesystem/MakeDir" => Rpc::MakeDir,
            "/filesystem.Filesystem/Move" => Rpc::Move,
            "/filesystem.Filesystem/Remove" => Rpc::Remove,
            _ => return None,
        })
    }

    /// Methods in envd's services that the fake does not implement.
    pub fn known_unimplemented(path: &str) -> bool {
        matches!(
            path,
            "/process.Process/StreamInput"
                | "/filesystem.Filesystem/WatchDir"
                | "/filesystem.Filesystem/CreateWatcher"
                | "/filesystem.Filesystem/GetWatcherEvents"
                | "/filesystem.Filesystem/RemoveWatcher"
        )
    }

    pub fn streaming(self) -> bool {
        matches!(self, Rpc::Start | Rpc::Connect)
    }

    pub fn request(self) -> &'static Msg {
        match self {
            Rpc::Start => &START,
            Rpc::Connect => &CONNECT,
            Rpc::List => &LIST,
            Rpc::SendInput => &SEND_INPUT,
            Rpc::SendSignal => &SEND_SIGNAL,
            Rpc::CloseStdin => &CLOSE_STDIN,
            Rpc::Update => &UPDATE,
            Rpc::Stat | Rpc::MakeDir | Rpc::Remove => &PATH_ONLY,
            Rpc::ListDir => &LIST_DIR,
            Rpc::Move => &MOVE,
        }
    }
}

fn lower_camel(s: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in s.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn soft(out: &mut Vec<Problem>, text: String) {
    out.push(Problem { gross: false, text });
}

fn gross(out: &mut Vec<Problem>, text: String) {
    out.push(Problem { gross: true, text });
}

/// Validate `v` as proto3-JSON for `msg`; `at` names the position for messages.
pub(crate) fn check(v: &Value, msg: &Msg, at: &str, out: &mut Vec<Problem>) {
    let Some(obj) = v.as_object() else {
        gross(
            out,
            format!("{at}: expected a JSON object ({}), got {v}", msg.name),
        );
        return;
    };
    for (k, val) in obj {
        let ty = match msg.fields.iter().find(|(n, _)| n == k) {
            Some((_, ty)) => *ty,
            None => {
                let camel = lower_camel(k);
                match msg.fields.iter().find(|(n, _)| *n == camel) {
                    Some((_, ty)) => {
                        soft(
                            out,
                            format!("{at}.{k}: proto3-JSON names are lowerCamel: `{camel}`"),
                        );
                        *ty
                    }
                    None => {
                        soft(out, format!("{at}.{k}: unknown field of {}", msg.name));
                        continue;
                    }
                }
            }
        };
        if !val.is_null() {
            check_ty(val, ty, &format!("{at}.{k}"), out);
        }
    }
    let set = |f: &str| obj.get(f).is_some_and(|v| !v.is_null());
    for r in msg.required.iter().filter(|r| !set(r)) {
        soft(out, format!("{at}: {} without `{r}`", msg.name));
    }
    if !msg.oneof.is_empty() {
        match msg.oneof.iter().filter(|f| set(f)).count() {
            0 => soft(
                out,
                format!("{at}: {} needs one of {:?}", msg.name, msg.oneof),
            ),
            1 => {}
            _ => gross(
                out,
                format!(
                    "{at}: {} has more than one of the oneof {:?}",
                    msg.name, msg.oneof
                ),
            ),
        }
    }
}

fn check_ty(v: &Value, ty: Ty, at: &str, out: &mut Vec<Problem>) {
    match ty {
        Ty::Str => {
            if !v.is_string() {
                gross(out, format!("{at}: expected a string, got {v}"));
            }
        }
        Ty::Bool => {
            if !v.is_boolean() {
                gross(out, format!("{at}: expected a bool, got {v}"));
            }
        }
        Ty::U32 => match v {
            Value::Number(n) if n.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)) => {}
            Value::String(s) if s.parse::<u32>().is_ok() => soft(
                out,
                format!("{at}: a uint32 is a JSON number in proto3-JSON, got the string {s:?}"),
            ),
            _ => gross(out, format!("{at}: expected a uint32 number, got {v}")),
        },
        Ty::Bytes => match v.as_str() {
            Some(s) if STANDARD.decode(s).is_ok() => {}
            Some(s)
                if URL_SAFE.decode(s).is_ok()
                    || STANDARD_NO_PAD.decode(s).is_ok()
                    || URL_SAFE_NO_PAD.decode(s).is_ok() =>
            {
                soft(
                    out,
                    format!(
                        "{at}: bytes should be standard padded base64 (accepted, but not what the SDKs send)"
                    ),
                );
            }
            _ => gross(out, format!("{at}: expected base64 bytes, got {v}")),
        },
        Ty::StrList => {
            if !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
                gross(out, format!("{at}: expected an array of strings, got {v}"));
            }
        }
        Ty::StrMap => {
            if !v
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
            {
                gross(
                    out,
                    format!("{at}: expected a map of string to string, got {v}"),
                );
            }
        }
        Ty::Signal => match v {
            Value::String(s)
                if matches!(
                    s.as_str(),
                    "SIGNAL_UNSPECIFIED" | "SIGNAL_SIGTERM" | "SIGNAL_SIGKILL"
                ) => {}
            Value::Number(n) if matches!(n.as_u64(), Some(0 | 9 | 15)) => soft(
                out,
                format!(
                    "{at}: enums are sent by name in proto3-JSON (\"SIGNAL_SIGKILL\"), got {n}"
                ),
            ),
            _ => gross(out, format!("{at}: expected a Signal enum name, got {v}")),
        },
        Ty::Msg(m) => check(v, m, at, out),
    }
}

/// The signal number a SendSignal request names (names or numbers).
pub(crate) fn signal_of(v: &Value) -> u64 {
    match v {
        Value::String(s) => match s.as_str() {
            "SIGNAL_SIGKILL" => 9,
            "SIGNAL_SIGTERM" => 15,
            _ => 0,
        },
        other => other.as_u64().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(rpc: Rpc, v: Value) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        check(&v, rpc.request(), "body", &mut out);
        out.into_iter().map(|p| (p.gross, p.text)).collect()
    }

    #[test]
    fn good_messages_pass() {
        assert!(problems(
            Rpc::Start,
            json!({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/home/user"},"stdin":false})
        )
        .is_empty());
        assert!(
            problems(
                Rpc::SendSignal,
                json!({"process":{"pid":9},"signal":"SIGNAL_SIGKILL"})
            )
            .is_empty()
        );
        assert!(
            problems(
                Rpc::SendInput,
                json!({"process":{"tag":"t"},"input":{"stdin":"aGkK"}})
            )
            .is_empty()
        );
        assert!(problems(Rpc::ListDir, json!({"path":"/home/user","depth":1})).is_empty());
    }

    #[test]
    fn bad_messages_are_reported() {
        let p = problems(
            Rpc::Start,
            json!({"process":{"cmd":"x","args":"nope"},"stdin":"no"}),
        );
        assert_eq!(p.iter().filter(|(g, _)| *g).count(), 2, "{p:?}");
        let p = problems(
            Rpc::ListDir,
            json!({"path":"/","depth":-1,"follow_links":true}),
        );
        assert!(p.iter().any(|(g, t)| *g && t.contains("depth")), "{p:?}");
        assert!(
            p.iter().any(|(g, t)| !*g && t.contains("follow_links")),
            "{p:?}"
        );
        let p = problems(Rpc::Start, json!({"process":{"cmd":"x"},"std_in":true}));
        assert!(
            p.iter().any(|(g, t)| !*g && t.contains("unknown field")),
            "{p:?}"
        );
        let p = problems(
            Rpc::SendSignal,
            json!({"process":{"pid":1,"tag":"x"},"signal":9}),
        );
        assert!(p.iter().any(|(g, _)| *g), "{p:?}");
        assert!(p.iter().any(|(g, t)| !*g && t.contains("by name")), "{p:?}");
    }
}
