//! The control plane (§1), under `/api`: X-API-KEY auth, one team per key, the route
//! table and per-endpoint body validation.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::response::Response;
use http::{Method, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use crate::Provider;
use crate::fs::Fs;
use crate::golden::classify;
use crate::server::{Ck, Req, parse_query};
use crate::state::{Inner, Life, Lookup, Sandbox};
use crate::time::rfc3339;

const ENVD_VERSION: &str = "0.5.7";
/// The v1 create default when `timeout` is absent.
const V1_DEFAULT_TIMEOUT: u64 = 15;

enum Route {
    Create { v2: bool },
    ListV2,
    ListLegacy,
    Get(String),
    Kill(String),
    Timeout(String),
    Refresh(String),
    Pause(String),
    Connect(String),
    Resume(String),
    Metrics(String),
}

impl Route {
    fn id(&self) -> Option<&str> {
        match self {
            Route::Create { .. } | Route::ListV2 | Route::ListLegacy => None,
            Route::Get(id)
            | Route::Kill(id)
            | Route::Timeout(id)
            | Route::Refresh(id)
            | Route::Pause(id)
            | Route::Connect(id)
            | Route::Resume(id)
            | Route::Metrics(id) => Some(id),
        }
    }
}

fn route(provider: Provider, method: &Method, path: &str, ck: &mut Ck<'_>) -> Option<Route> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let dec = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let e2b_only = |ck: &mut Ck<'_>, what: &str| {
        if provider != Provider::E2b {
            ck.gross(format!(
                "{what} is E2B-only; {provider:?} uses the v1 path (/sandboxes...)"
            ));
        }
    };
    let r = match (method.as_str(), segs.as_slice()) {
        ("POST", ["sandboxes"]) => Route::Create { v2: false },
        ("GET", ["sandboxes"]) => Route::ListLegacy,
        ("POST", ["v2", "sandboxes"]) => {
            e2b_only(ck, "POST /v2/sandboxes");
            Route::Create { v2: true }
        }
        ("GET", ["v2", "sandboxes"]) => Route::ListV2,
        ("GET", ["sandboxes", id]) => Route::Get(dec(id)),
        ("DELETE", ["sandboxes", id]) => Route::Kill(dec(id)),
        ("POST", ["sandboxes", id, "timeout"]) => Route::Timeout(dec(id)),
        ("POST", ["sandboxes", id, "refreshes"]) => Route::Refresh(dec(id)),
        ("POST", ["sandboxes", id, "pause"]) => Route::Pause(dec(id)),
        ("POST", ["sandboxes", id, "connect"]) => Route::Connect(dec(id)),
        ("POST", ["v2", "sandboxes", id, "connect"]) => {
            e2b_only(ck, "POST /v2/sandboxes/{id}/connect");
            Route::Connect(dec(id))
        }
        ("POST", ["sandboxes", id, "resume"]) => Route::Resume(dec(id)),
        ("GET", ["sandboxes", id, "metrics"]) => Route::Metrics(dec(id)),
        _ => {
            ck.gross(format!(
                "{method} {path} is not in the control plane's route table (§1.3)"
            ));
            return None;
        }
    };
    Some(r)
}

/// Checks `obj`'s keys against `allowed`, with hints for the usual spelling mistakes.
fn check_keys(
    provider: Provider,
    what: &str,
    obj: &Map<String, Value>,
    allowed: &[&str],
    ck: &mut Ck<'_>,
) {
    for k in obj.keys().filter(|k| !allowed.contains(&k.as_str())) {
        let hint = match (provider, k.as_str()) {
            (Provider::NovitaLegacy, "allow_internet_access") => {
                " (legacy Novita spells it allowInternetAccess)"
            }
            (_, "allowInternetAccess") => " (the modern API spells it allow_internet_access)",
            (Provider::E2b, "secure") => " (NewSandboxV2 has no `secure`)",
            (_, "template_id" | "templateId" | "env_vars" | "envs") => {
                " (the fields are templateID, envVars)"
            }
            _ => "",
        };
        ck.v(format!(
            "{what}: unknown field `{k}` for {provider:?}{hint}"
        ));
    }
}

fn want_bool(obj: &Map<String, Value>, key: &str, what: &str, ck: &mut Ck<'_>) -> Option<bool> {
    match obj.get(key) {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            ck.gross(format!("{what}: `{key}` must be a bool, got {v}"));
            None
        }
    }
}

fn want_int(obj: &Map<String, Value>, key: &str, what: &str, ck: &mut Ck<'_>) -> Option<u64> {
    match obj.get(key) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) => Some(n),
            None => {
                ck.gross(format!(
                    "{what}: `{key}` must be a non-negative integer (seconds), got {v}"
                ));
                None
            }
        },
    }
}

fn want_str_map(
    obj: &Map<String, Value>,
    key: &str,
    what: &str,
    ck: &mut Ck<'_>,
) -> BTreeMap<String, String> {
    match obj.get(key) {
        None => BTreeMap::new(),
        Some(Value::Object(m)) if m.values().all(Value::is_string) => m
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
            .collect(),
        Some(v) => {
            ck.gross(format!(
                "{what}: `{key}` must be a map of string to string, got {v}"
            ));
            BTreeMap::new()
        }
    }
}

/// The body as an object (`None` when empty); anything else is gross.
fn object(req: &Req, what: &str, ck: &mut Ck<'_>) -> Option<Map<String, Value>> {
    match req.json_body(ck)? {
        Value::Object(m) => Some(m),
        other => {
            ck.gross(format!("{what}: body must be a JSON object, got {other}"));
            None
        }
    }
}

struct CreateReq {
    template_id: String,
    timeout: u64,
    metadata: BTreeMap<String, String>,
    env_vars: BTreeMap<String, String>,
    secure: Option<bool>,
    auto_pause: bool,
}

fn validate_create(provider: Provider, v2: bool, req: &Req, ck: &mut Ck<'_>) -> Option<CreateReq> {
    let what = "create";
    let Some(obj) = object(req, what, ck) else {
        ck.gross("create: body required (NewSandbox JSON with templateID and timeout)");
        return None;
    };
    let allowed: &[&str] = match (provider, v2) {
        (Provider::E2b, false) => &[
            "templateID",
            "timeout",
            "autoPause",
            "autoResume",
            "secure",
            "allow_internet_access",
            "network",
            "metadata",
            "envVars",
            "mcp",
            "iam",
            "volumeMounts",
            "autoPauseMemory",
        ],
        (Provider::E2b, true) => &[
            "templateID",
            "timeout",
            "autoPause",
            "autoResume",
            "allow_internet_access",
            "network",
            "metadata",
            "envVars",
            "mcp",
            "iam",
            "volumeMounts",
            "autoPauseMemory",
        ],
        (Provider::Novita, _) => &[
            "templateID",
            "timeout",
            "autoPause",
            "autoResume",
            "secure",
            "allow_internet_access",
            "network",
            "metadata",
            "envVars",
            "mcp",
            "volumeMounts",
            "nodeID",
            "secrets",
        ],
        (Provider::NovitaLegacy, _) => &[
            "templateID",
            "timeout",
            "autoPause",
            "secure",
            "allowInternetAccess",
            "metadata",
            "envVars",
            "nodeID",
        ],
    };
    check_keys(provider, what, &obj, allowed, ck);
    let template_id = match obj.get("templateID") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) => {
            ck.gross(format!(
                "create: `templateID` must be a non-empty string, got {v}"
            ));
            String::new()
        }
        None => {
            ck.gross("create: `templateID` is required");
            String::new()
        }
    };
    let timeout = match want_int(&obj, "timeout", what, ck) {
        Some(t) => t,
        None => {
            if !obj.contains_key("timeout") {
                ck.v(format!(
                    "create without `timeout`: the v1 server default is {V1_DEFAULT_TIMEOUT} s; always send it"
                ));
            }
            V1_DEFAULT_TIMEOUT
        }
    };
    let metadata = want_str_map(&obj, "metadata", what, ck);
    let env_vars = want_str_map(&obj, "envVars", what, ck);
    let secure = want_bool(&obj, "secure", what, ck);
    let auto_pause = want_bool(&obj, "autoPause", what, ck).unwrap_or(false);
    want_bool(&obj, "allow_internet_access", what, ck);
    want_bool(&obj, "allowInternetAccess", what, ck);
    if let Some(ar) = obj.get("autoResume")
        && !ar
            .as_object()
            .is_some_and(|m| m.get("enabled").is_none_or(Value::is_boolean))
    {
        ck.gross(format!(
            "create: `autoResume` must be {{\"enabled\": bool}}, got {ar}"
        ));
    }
    if provider == Provider::NovitaLegacy && secure == Some(true) {
        ck.v("create: legacy Novita domains take `secure` false or absent");
    }
    Some(CreateReq {
        template_id,
        timeout,
        metadata,
        env_vars,
        secure,
        auto_pause,
    })
}

fn sandbox_json(sb: &Sandbox) -> Value {
    let mut v = json!({
        "templateID": sb.template_id,
        "sandboxID": sb.base_id,
        "clientID": sb.client_id,
        "envdVersion": ENVD_VERSION,
        "alias": sb.alias,
        "trafficAccessToken": null,
        "domain": null,
        // Proves the client ignores fields it does not know.
        "unknownFutureField": 1,
    });
    if let Some(t) = &sb.token {
        v["envdAccessToken"] = json!(t);
    }
    v
}

fn detail_json(sb: &Sandbox) -> Value {
    json!({
        "templateID": sb.template_id,
        "alias": sb.alias,
        "sandboxID": sb.base_id,
        "clientID": sb.client_id,
        "startedAt": rfc3339(sb.started_at),
        "endAt": rfc3339(sb.end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": sb.life.as_str(),
        "metadata": sb.metadata,
        "lifecycle": {"autoResume": false, "onTimeout": if sb.auto_pause { "pause" } else { "kill" }},
        "unknownFutureField": {"nested": [1, 2]},
    })
}

/// Validate the body of the id routes (not create).
fn validate_id_route(provider: Provider, r: &Route, req: &Req, ck: &mut Ck<'_>) -> Option<u64> {
    let (what, allowed): (&str, &[&str]) = match (r, provider) {
        (Route::Timeout(_), _) => ("timeout", &["timeout"]),
        (Route::Refresh(_), _) => ("refreshes", &["duration"]),
        (Route::Pause(_), Provider::E2b) => ("pause", &["memory", "requireHealthyGuest"]),
        (Route::Pause(_), Provider::Novita) => ("pause", &[]),
        (Route::Pause(_), Provider::NovitaLegacy) => ("pause", &["sync"]),
        (Route::Connect(_), Provider::E2b) => ("connect", &["timeout", "memory"]),
        (Route::Connect(_), Provider::Novita) => (
            "connect",
            &[
                "timeout",
                "secure",
                "allowPublicTraffic",
                "network",
                "autoPause",
            ],
        ),
        (Route::Connect(_), Provider::NovitaLegacy) => (
            "connect",
            &["timeout", "autoPause", "secure", "allowPublicTraffic"],
        ),
        (Route::Resume(_), _) => ("resume", &["timeout", "autoPause"]),
        _ => {
            if !req.body.is_empty() {
                ck.v(format!("{} {} takes no body", req.method, req.path));
            }
            return None;
        }
    };
    let obj = object(req, what, ck);
    let Some(obj) = obj else {
        if matches!(r, Route::Timeout(_)) {
            ck.gross("timeout: body {\"timeout\": <seconds>} required");
        }
        return None;
    };
    check_keys(provider, what, &obj, allowed, ck);
    for k in [
        "memory",
        "requireHealthyGuest",
        "sync",
        "secure",
        "allowPublicTraffic",
        "autoPause",
    ] {
        if allowed.contains(&k) {
            want_bool(&obj, k, what, ck);
        }
    }
    want_int(&obj, "duration", what, ck);
    let timeout = want_int(&obj, "timeout", what, ck);
    if matches!(r, Route::Timeout(_)) && !obj.contains_key("timeout") {
        ck.gross("timeout: `timeout` is required");
    }
    timeout
}

pub(crate) fn handle(inner: &Inner, req: &Req, ck: &mut Ck<'_>) -> Response {
    let provider = inner.provider();
    let key = req.header("x-api-key").map(str::to_owned);
    if key.is_none() {
        ck.v("missing X-API-KEY header");
    }
    if req.header("authorization").is_some() {
        ck.v("Authorization header on a control-plane request (API-key auth sends none)");
    }
    let kind = classify(true, req.method.as_str(), &req.path);
    if !req.body.is_empty()
        && !kind.is_some_and(|k| inner.has_golden(k))
        && req.content_type().as_deref() != Some("application/json")
    {
        ck.v(format!(
            "Content-Type {:?} on a control-plane body; expected application/json",
            req.header("content-type")
        ));
    }
    let Some(r) = route(provider, &req.method, &req.path, ck) else {
        return gate_or(ck, req, inner);
    };
    if let Some(kind) = kind {
        inner.check_golden(kind, req, ck);
    }

    let create = match &r {
        Route::Create { v2 } => validate_create(provider, *v2, req, ck),
        _ => None,
    };
    let timeout = if r.id().is_some() {
        validate_id_route(provider, &r, req, ck)
    } else {
        None
    };
    let list_query = match &r {
        Route::ListV2 | Route::ListLegacy => {
            Some(validate_list_query(matches!(r, Route::ListV2), req, ck))
        }
        _ => None,
    };
    // The id's form is a protocol matter (legacy composite ids), checked before faults.
    // The guard is released inside the closure, before `ck` records anything.
    let lookup = r.id().map(|id| (id.to_owned(), inner.lock().lookup(id)));
    let found = match lookup {
        None | Some((_, Lookup::Unknown)) => None,
        Some((_, Lookup::Found(i))) => Some(i),
        Some((id, Lookup::WrongForm { expected })) => {
            ck.gross(format!(
                "sandbox id {id:?} is not the form {provider:?} clients use: expected {expected:?}"
            ));
            None
        }
    };

    let cut = match ck.gate(req) {
        Ok(cut) => cut,
        Err(resp) => return resp,
    };
    let Some(key) = key.filter(|k| inner.config.api_keys.contains(k)) else {
        return inner.api_error(
            StatusCode::UNAUTHORIZED,
            "Invalid API key, it must start with the key prefix and be valid",
        );
    };

    let mut st = inner.lock();
    if let Route::Create { .. } = r {
        let Some(c) = create else {
            return inner.api_error(StatusCode::BAD_REQUEST, "invalid body");
        };
        st.next_sandbox += 1;
        let n = st.next_sandbox;
        let base_id = format!("sbx{n}");
        let client_id = format!("c0ffee{n}");
        let id = match provider {
            Provider::NovitaLegacy => format!("{base_id}-{client_id}"),
            _ => base_id.clone(),
        };
        let token = match provider {
            Provider::E2b => true,
            Provider::Novita | Provider::NovitaLegacy => c.secure == Some(true),
        }
        .then(|| format!("envd-tok-{n}"));
        let now = SystemTime::now();
        let sb = Sandbox {
            id,
            base_id,
            client_id,
            api_key: key,
            alias: Some(c.template_id.clone()),
            template_id: c.template_id,
            life: Life::Running,
            timeout: c.timeout,
            started_at: now,
            end_at: now + Duration::from_secs(c.timeout),
            metadata: c.metadata,
            env_vars: c.env_vars,
            token,
            auto_pause: c.auto_pause,
            fs: Fs::new(),
            next_pid: 100,
            processes: BTreeMap::new(),
            contexts: Vec::new(),
            next_ctx: 0,
        };
        let v = sandbox_json(&sb);
        st.sandboxes.push(sb);
        drop(st);
        return inner.json(StatusCode::CREATED, &v, cut);
    }
    if let Some(q) = list_query {
        let q = match q {
            Ok(q) => q,
            Err(msg) => {
                drop(st);
                return inner.api_error(StatusCode::BAD_REQUEST, msg);
            }
        };
        let all: Vec<(usize, Value)> = st
            .sandboxes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.api_key == key && s.life != Life::Gone)
            .filter(|(_, s)| q.states.contains(&s.life))
            .filter(|(_, s)| q.metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
            .map(|(i, s)| (i, detail_json(s)))
            .collect();
        drop(st);
        let page: Vec<&(usize, Value)> = all
            .iter()
            .filter(|(i, _)| *i >= q.start)
            .take(q.limit)
            .collect();
        let next = page
            .last()
            .and_then(|(last, _)| all.iter().find(|(i, _)| i > last))
            .map(|(i, _)| format!("page-{i}"));
        let body = Value::Array(page.into_iter().map(|(_, v)| v.clone()).collect());
        let extra: Vec<(&str, String)> =
            next.map(|t| vec![("x-next-token", t)]).unwrap_or_default();
        return inner.plain(
            StatusCode::OK,
            Some(crate::body::JSON),
            &extra,
            body.to_string(),
            cut,
        );
    }

    let id = r.id().unwrap_or_default().to_owned();
    let Some(i) = found.filter(|i| {
        let s = &st.sandboxes[*i];
        s.api_key == key && s.life != Life::Gone
    }) else {
        drop(st);
        return inner.api_error(StatusCode::NOT_FOUND, format!("sandbox \"{id}\" not found"));
    };
    let sb = &mut st.sandboxes[i];
    let empty = |cut| inner.plain(StatusCode::NO_CONTENT, None, &[], Vec::new(), cut);
    match r {
        Route::Get(_) => {
            let v = detail_json(sb);
            drop(st);
            inner.json(StatusCode::OK, &v, cut)
        }
        Route::Kill(_) => {
            sb.vanish();
            drop(st);
            empty(cut)
        }
        Route::Timeout(_) => {
            sb.set_timeout(timeout.unwrap_or(0));
            drop(st);
            empty(cut)
        }
        Route::Refresh(_) => {
            drop(st);
            empty(cut)
        }
        Route::Pause(_) => {
            if sb.life == Life::Paused {
                drop(st);
                return inner.api_error(
                    StatusCode::CONFLICT,
                    format!("sandbox \"{id}\" is already paused"),
                );
            }
            sb.life = Life::Paused;
            drop(st);
            empty(cut)
        }
        Route::Connect(_) | Route::Resume(_) => {
            let was_paused = sb.life == Life::Paused;
            if matches!(r, Route::Resume(_)) && !was_paused {
                drop(st);
                return inner.api_error(
                    StatusCode::CONFLICT,
                    format!("sandbox \"{id}\" is already running"),
                );
            }
            sb.life = Life::Running;
            if let Some(t) = timeout {
                sb.set_timeout(t);
            }
            let v = sandbox_json(sb);
            drop(st);
            let status = if was_paused {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            inner.json(status, &v, cut)
        }
        Route::Metrics(_) => {
            drop(st);
            inner.json(StatusCode::OK, &json!([]), cut)
        }
        Route::Create { .. } | Route::ListV2 | Route::ListLegacy => {
            drop(st);
            inner.api_error(StatusCode::INTERNAL_SERVER_ERROR, "unreachable")
        }
    }
}

fn gate_or(ck: &mut Ck<'_>, req: &Req, inner: &Inner) -> Response {
    match ck.gate(req) {
        Err(resp) => resp,
        Ok(_) => inner.api_error(StatusCode::NOT_FOUND, "not found"),
    }
}

struct ListQuery {
    states: Vec<Life>,
    metadata: Vec<(String, String)>,
    limit: usize,
    /// Index into the sandbox table where the page starts.
    start: usize,
}

/// `metadata`, `state`, `limit`, `nextToken` (v2); `metadata` only (legacy). `Err` is a
/// 400 answer (also a violation).
fn validate_list_query(v2: bool, req: &Req, ck: &mut Ck<'_>) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        states: if v2 {
            vec![Life::Running, Life::Paused]
        } else {
            vec![Life::Running]
        },
        metadata: Vec::new(),
        limit: 100,
        start: 0,
    };
    let mut states: Vec<Life> = Vec::new();
    for (k, v) in req.query_pairs() {
        match (k.as_str(), v2) {
            ("metadata", _) => {
                // The SDKs URL-encode `k=v&k2=v2` as the parameter value.
                q.metadata.extend(parse_query(&v));
            }
            ("state", true) => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    match s {
                        "running" => states.push(Life::Running),
                        "paused" => states.push(Life::Paused),
                        other => {
                            let msg = format!("state {other:?} is neither running nor paused");
                            ck.v(msg.clone());
                            return Err(msg);
                        }
                    }
                }
            }
            ("limit", true) => match v.parse::<usize>() {
                Ok(n) if (1..=100).contains(&n) => q.limit = n,
                _ => {
                    let msg = format!("limit {v:?} is not an integer in 1..=100");
                    ck.v(msg.clone());
                    return Err(msg);
                }
            },
            ("nextToken", true) => {
                match v
                    .strip_prefix("page-")
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    Some(n) => q.start = n,
                    None => {
                        let msg = format!("nextToken {v:?} was not issued by X-Next-Token");
                        ck.v(msg.clone());
                        return Err(msg);
                    }
                }
            }
            (other, _) => ck.v(format!("unknown list query parameter `{other}`")),
        }
    }
    if !states.is_empty() {
        q.states = states;
    }
    if !req.body.is_empty() {
        ck.v("list takes no body");
    }
    Ok(q)
}
