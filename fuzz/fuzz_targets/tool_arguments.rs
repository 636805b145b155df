//! Decoding of MCP tool arguments (`runbox_mcp::types`), fuzzed, with what is done with them
//! right after: resource URIs, timeouts, and the cut of text to fit a JSON answer.
//!
//! An input is JSON, as a client sends a tool's `arguments`; it is decoded as every tool's
//! arguments in turn. What must hold, whatever the input:
//! - nothing panics;
//! - arguments that decode agree with the input schema the server publishes for them
//!   (generated from the same types): no property the schema lacks, none it requires
//!   missing;
//! - enums the server also writes (language, network, manager, encoding) read back as
//!   written;
//! - a `timeout_seconds` is refused unless it is a positive number of seconds a `Duration`
//!   holds, and converts to (nearly) the same number otherwise;
//! - resource URIs: whatever parses has a non-empty sandbox id without `/` and an absolute
//!   path, and the URI the server would write for it parses back to the same; an error
//!   names the URI;
//! - `fit_json` keeps the longest start of a text that escapes to at most its budget, as
//!   serde_json escapes.
//!
//! The raw input, when it is UTF-8, is also tried as a resource URI and as a text to fit.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use runbox_core::Language;
use runbox_mcp::fuzzing::{
    data_file_uri, fit_json, parse_resource_piece, parse_resource_uri, sandbox_file_uri, seconds,
};
use runbox_mcp::types::{
    CreateSandboxArgs, Encoding, InstallPackagesArgs, LanguageArg, ListFilesArgs, ManagerArg,
    NetworkArg, ProcessArgs, ReadFileArgs, ReadProcessArgs, RunCodeArgs, RunCommandArgs,
    SandboxArgs, SetTimeoutArgs, WriteFileArgs,
};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Most strings of an input tried as URIs and texts.
const MAX_STRINGS: usize = 16;

/// A type's published properties and required ones.
type Shape = (BTreeSet<String>, BTreeSet<String>);

static SHAPES: Mutex<BTreeMap<&'static str, Shape>> = Mutex::new(BTreeMap::new());

fn shape<T: JsonSchema>() -> Shape {
    let name = std::any::type_name::<T>();
    let mut shapes = SHAPES.lock().unwrap_or_else(|e| e.into_inner());
    shapes
        .entry(name)
        .or_insert_with(|| {
            let schema = schemars::schema_for!(T);
            let schema = schema.as_value();
            let properties = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let required = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            (properties, required)
        })
        .clone()
}

/// Decodes `value` as `T`, as the server does a tool's arguments, and checks the result
/// against `T`'s schema.
fn decode<T: DeserializeOwned + JsonSchema + Debug>(value: &Value) -> Option<T> {
    let args = serde_json::from_value::<T>(value.clone()).ok()?;
    // Arguments always come as an object; serde also takes a struct from an array.
    if let Some(object) = value.as_object() {
        let (properties, required) = shape::<T>();
        let name = std::any::type_name::<T>();
        for key in object.keys() {
            assert!(
                properties.contains(key),
                "{name} took {key:?}, which its schema does not have: {value}"
            );
        }
        for key in &required {
            assert!(
                object.contains_key(key),
                "{name} decoded without {key:?}, which its schema requires: {value} -> {args:?}"
            );
        }
    }
    Some(args)
}

/// `v` serialized reads back as `v`.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: &T) {
    let json = serde_json::to_value(v).unwrap_or_else(|e| panic!("{v:?} does not serialize: {e}"));
    let back: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{json} does not read back: {e}"));
    assert_eq!(&back, v, "{json}");
}

fn check_timeout(t: Option<f64>) {
    let Some(t) = t else { return };
    match seconds(t) {
        Ok(d) => {
            assert!(
                t.is_finite() && t > 0.0,
                "timeout_seconds {t} taken as {d:?}"
            );
            let back = d.as_secs_f64();
            assert!(
                (back - t).abs() <= t * 1e-9 + 1e-9,
                "timeout_seconds {t} became {d:?}"
            );
        }
        Err(e) => {
            let fits = t.is_finite() && t > 0.0 && t < 1e19;
            assert!(!fits, "timeout_seconds {t} refused: {e}");
        }
    }
}

fn language(l: LanguageArg) {
    round_trip(&l);
    let _: Language = l.into();
}

fn check_uri(uri: &str) {
    match parse_resource_uri(uri) {
        Ok((Some(id), path)) => {
            assert!(
                !id.is_empty() && !id.contains('/'),
                "{uri:?}: sandbox id {id:?}"
            );
            assert!(
                path.len() > 1 && path.starts_with('/') && !path.starts_with("//"),
                "{uri:?}: path {path:?}"
            );
            let again = sandbox_file_uri(&id, &path);
            assert_eq!(
                parse_resource_uri(&again),
                Ok((Some(id), path)),
                "{uri:?} written back as {again:?}"
            );
        }
        Ok((None, name)) if name.starts_with("output://") => {
            // A kept output: its key is hex, and nothing follows it in the name given.
            let key = name.trim_start_matches("output://").trim_end_matches('/');
            assert!(
                !key.is_empty() && key.chars().all(|c| c.is_ascii_hexdigit()),
                "{uri:?}: output key {key:?}"
            );
        }
        Ok((None, name)) => {
            // Data files are named by their path below the data directory: never absolute.
            if !name.starts_with('/') {
                let again = data_file_uri(&name);
                assert_eq!(
                    parse_resource_uri(&again),
                    Ok((None, name)),
                    "{uri:?} written back as {again:?}"
                );
            }
        }
        Err(message) => assert!(message.contains(uri), "{uri:?}: {message}"),
    }
    // A query asks for a piece: the URI before it parses as it does alone.
    if let Ok((id, name, piece)) = parse_resource_piece(uri) {
        let base = uri.split_once('?').map_or(uri, |(b, _)| b);
        assert_eq!(parse_resource_uri(base), Ok((id, name)), "{uri:?}");
        assert_eq!(piece.is_some(), uri.contains('?'), "{uri:?}");
    }
}

/// Bytes `s` takes inside a JSON string, as serde_json writes it.
fn json_len(s: &str) -> usize {
    serde_json::to_string(s).map_or(0, |j| j.len() - 2)
}

fn check_fit(text: &str, budget: usize) {
    let fit = fit_json(text, budget);
    assert!(
        text.starts_with(fit),
        "fit_json({text:?}, {budget}) is not a start: {fit:?}"
    );
    assert!(
        json_len(fit) <= budget,
        "fit_json({text:?}, {budget}) = {fit:?} is over the budget"
    );
    if let Some(next) = text[fit.len()..].chars().next() {
        let more = &text[..fit.len() + next.len_utf8()];
        assert!(
            json_len(more) > budget,
            "fit_json({text:?}, {budget}) = {fit:?} stops short"
        );
    }
}

fn check_text(text: &str, seed: usize) {
    check_uri(text);
    for budget in [0, 1, seed % 64, text.len() / 2, text.len()] {
        check_fit(text, budget);
    }
}

fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    if out.len() >= MAX_STRINGS {
        return;
    }
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(o) => o.iter().for_each(|(k, v)| {
            out.push(k);
            strings(v, out);
        }),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let seed = data.first().map_or(0, |b| usize::from(*b));
    if let Ok(text) = std::str::from_utf8(data) {
        check_text(text, seed);
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut found = Vec::new();
    strings(&value, &mut found);
    for s in found {
        check_text(s, seed);
    }

    if let Some(a) = decode::<RunCodeArgs>(&value) {
        language(a.language);
        check_timeout(a.timeout_seconds);
    }
    if let Some(a) = decode::<RunCommandArgs>(&value) {
        check_timeout(a.timeout_seconds);
    }
    if let Some(a) = decode::<CreateSandboxArgs>(&value) {
        round_trip(&a.network);
        check_timeout(a.timeout_seconds);
    }
    if let Some(a) = decode::<InstallPackagesArgs>(&value) {
        round_trip(&a.manager);
        check_timeout(a.timeout_seconds);
    }
    if let Some(a) = decode::<SetTimeoutArgs>(&value) {
        check_timeout(Some(a.timeout_seconds));
    }
    if let Some(a) = decode::<ReadFileArgs>(&value) {
        a.encoding.iter().for_each(round_trip);
    }
    if let Some(a) = decode::<WriteFileArgs>(&value) {
        a.encoding.iter().for_each(round_trip);
    }
    decode::<ListFilesArgs>(&value);
    if let Some(a) = decode::<ReadProcessArgs>(&value) {
        check_timeout(a.wait_seconds.filter(|w| *w != 0.0));
    }
    decode::<ProcessArgs>(&value);
    decode::<SandboxArgs>(&value);
    // Enums on their own, as the server also writes them.
    if let Ok(l) = serde_json::from_value::<LanguageArg>(value.clone()) {
        language(l);
    }
    for_enum::<NetworkArg>(&value);
    for_enum::<ManagerArg>(&value);
    for_enum::<Encoding>(&value);
});

fn for_enum<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &Value) {
    if let Ok(v) = serde_json::from_value::<T>(value.clone()) {
        round_trip(&v);
    }
}
