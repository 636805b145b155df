//! The layers of `runbox serve`'s settings, merged over the one schema
//! ([`ServeArgs`](super::ServeArgs)) without naming any setting: a flag wins over its
//! `RUNBOX_*` variable (clap does that), both win over the config file, and the file wins
//! over the schema's defaults. Lists (`allow_host`, `pass_through_env`, ...) add up: the
//! file's entries come first, then the variable's or the flags'.
//!
//! The file's keys are the settings' ids (the flags without their dashes, `-` as `_`). Its
//! values go through the same clap parsers as flags do: the file's `pool = 4` becomes
//! `--pool=4` unless a flag or variable set `pool`, and the whole is parsed once more. So one
//! parser reads each setting wherever it comes from, and an error names the setting.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use anyhow::{Context, bail};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

use super::Env;

/// Keys renamed to the flags' names. The old ones are still read, with a warning.
const RENAMED_KEYS: &[(&str, &str)] = &[
    ("allowed_hosts", "allowed_host"),
    ("allowed_origins", "allowed_origin"),
    ("allow_hosts", "allow_host"),
    ("allow_addresses", "allow_address"),
];

/// Variables renamed to the flags' names: read, with a warning, when the new one is not set.
const RENAMED_VARIABLES: &[(&str, &str)] = &[
    ("RUNBOX_ALLOWED_HOSTS", "allowed_host"),
    ("RUNBOX_ALLOWED_ORIGINS", "allowed_origin"),
];

/// The old `[limits]` table: its keys, and the settings they are now (at the top level).
const LIMITS_TABLE: &[(&str, &str)] = &[
    ("memory_mb", "memory_mb"),
    ("pids", "pids"),
    ("cpus", "cpus"),
    ("workspace_mb", "workspace_mb"),
    ("tmp_mb", "tmp_mb"),
    ("inodes", "inodes"),
    ("open_files", "open_files"),
    ("output_bytes", "output_limit"),
];

/// Settings the file cannot hold: the file itself.
const NOT_IN_FILE: &[&str] = &["config"];

/// The settings of `cmd` from the flags and variables in `given` (parsed by a command with
/// the same arguments), over `file`'s, over the defaults.
pub(crate) fn merge(
    cmd: &Command,
    given: &ArgMatches,
    file: Option<&Path>,
    env: Env<'_>,
) -> anyhow::Result<ArgMatches> {
    let (path, mut from_file) = match file {
        Some(path) => (path.display().to_string(), read(cmd, path)?),
        None => (String::new(), BTreeMap::new()),
    };
    let explicit = |id: &str| {
        matches!(
            given.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    // A file's setting yields to a flag or variable it cannot go with (`stdio` to `--http`).
    for arg in settings(cmd) {
        let id = arg.get_id().as_str();
        if from_file.contains_key(id) && conflicting(cmd, arg).any(&explicit) {
            from_file.remove(id);
        }
    }
    for arg in settings(cmd) {
        let id = arg.get_id().as_str();
        if from_file.contains_key(id)
            && let Some(other) = conflicting(cmd, arg).find(|o| from_file.contains_key(*o))
        {
            bail!("{path}: {id} and {other} cannot both be set: choose one");
        }
    }

    let mut argv = vec![OsString::from("serve")];
    for arg in settings(cmd) {
        let id = arg.get_id().as_str();
        let list = is_list(arg);
        let file_values = from_file.remove(id).unwrap_or_default();
        match given.value_source(id) {
            Some(ValueSource::CommandLine) => {
                if list {
                    argv.extend(file_values);
                }
                argv.extend(occurrences(given, arg));
            }
            Some(ValueSource::EnvVariable) => {
                // Parsed again, clap reads the variable again; a list adds to the file's.
                if list && !file_values.is_empty() {
                    argv.extend(file_values);
                    argv.extend(occurrences(given, arg));
                }
            }
            _ => {
                argv.extend(file_values);
                argv.extend(renamed_variable(arg, env));
            }
        }
    }
    cmd.clone()
        .try_get_matches_from(argv)
        .map_err(|e| match file {
            Some(_) => anyhow::anyhow!("{path}, with the flags and variables: {}", reason(&e)),
            None => anyhow::anyhow!("{}", reason(&e)),
        })
}

/// The arguments that are settings: all but clap's own (help, version).
fn settings(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| a.get_long().is_some() && !matches!(a.get_id().as_str(), "help" | "version"))
}

/// Whether an argument takes many values (repeated, or comma-separated).
fn is_list(arg: &Arg) -> bool {
    matches!(arg.get_action(), clap::ArgAction::Append)
}

/// The ids of the arguments `arg` conflicts with, either way round.
fn conflicting<'a>(cmd: &'a Command, arg: &'a Arg) -> impl Iterator<Item = &'a str> {
    let id = arg.get_id();
    let mine = cmd.get_arg_conflicts_with(arg).into_iter();
    let theirs = settings(cmd).filter(move |other| {
        cmd.get_arg_conflicts_with(other)
            .iter()
            .any(|a| a.get_id() == id)
    });
    mine.chain(theirs).map(|a| a.get_id().as_str())
}

fn flag(arg: &Arg) -> String {
    format!("--{}", arg.get_long().unwrap_or_default())
}

/// `arg` as given in `given`, written as flags.
fn occurrences(given: &ArgMatches, arg: &Arg) -> Vec<OsString> {
    let id = arg.get_id().as_str();
    if !arg.get_action().takes_values() {
        return if given.get_flag(id) {
            vec![flag(arg).into()]
        } else {
            Vec::new()
        };
    }
    given
        .get_raw(id)
        .into_iter()
        .flatten()
        .map(|value| with_value(arg, value))
        .collect()
}

fn with_value(arg: &Arg, value: &OsStr) -> OsString {
    let mut s = OsString::from(flag(arg));
    s.push("=");
    s.push(value);
    s
}

/// The values of a variable renamed to `arg`'s, when it is set, as flags.
fn renamed_variable(arg: &Arg, env: Env<'_>) -> Vec<OsString> {
    let id = arg.get_id().as_str();
    let Some((old, _)) = RENAMED_VARIABLES.iter().find(|(_, new)| *new == id) else {
        return Vec::new();
    };
    let Ok(value) = env(old) else {
        return Vec::new();
    };
    let new = arg
        .get_env()
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    tracing::warn!("{old} is deprecated: it is now {new}");
    value
        .split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| with_value(arg, OsStr::new(v.trim())))
        .collect()
}

/// The settings of the file at `path`, each checked by its parser and written as flags.
fn read(cmd: &Command, path: &Path) -> anyhow::Result<BTreeMap<String, Vec<OsString>>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {shown}"))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("in {shown}"))?;
    let mut entries = Vec::new();
    for (key, value) in table {
        if key == "limits"
            && let toml::Value::Table(limits) = value
        {
            tracing::warn!(
                "{shown}: the [limits] table is deprecated: write its keys at the top level \
                 (output_bytes is now output_limit)"
            );
            for (key, value) in limits {
                match LIMITS_TABLE.iter().find(|(old, _)| *old == key) {
                    Some((_, new)) => {
                        entries.push(((*new).to_owned(), format!("limits.{key}"), value))
                    }
                    None => bail!("{shown}: limits.{key} is not a setting"),
                }
            }
        } else if let Some((_, new)) = RENAMED_KEYS.iter().find(|(old, _)| *old == key) {
            tracing::warn!("{shown}: {key} is deprecated: it is now {new}");
            entries.push(((*new).to_owned(), key, value));
        } else {
            entries.push((key.clone(), key, value));
        }
    }
    // Each value is checked alone: no variable, no other setting.
    let bare = cmd.clone().mut_args(|a| a.env(None));
    let mut settings = BTreeMap::new();
    for (id, written, value) in entries {
        let arg = settings_of(cmd)
            .find(|a| a.get_id().as_str() == id)
            .ok_or_else(|| unknown(cmd, &shown.to_string(), &written))?;
        let flags = as_flags(&bare, arg, &written, value).with_context(|| format!("in {shown}"))?;
        if settings.insert(id.clone(), flags).is_some() {
            bail!("{shown}: {id} is set twice ({written} is another name of it)");
        }
    }
    Ok(settings)
}

/// The settings a file may hold.
fn settings_of(cmd: &Command) -> impl Iterator<Item = &Arg> {
    settings(cmd).filter(|a| !NOT_IN_FILE.contains(&a.get_id().as_str()))
}

/// An unknown key, with the setting it may be a typo of.
fn unknown(cmd: &Command, path: &str, key: &str) -> anyhow::Error {
    let near = settings_of(cmd)
        .map(|a| a.get_id().as_str())
        .map(|id| (strsim::jaro(key, id), id))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match near {
        Some((_, id)) => anyhow::anyhow!("{path}: {key} is not a setting; did you mean {id}?"),
        None => anyhow::anyhow!(
            "{path}: {key} is not a setting (the settings are the flags of `runbox serve --help`, \
             without the dashes and with _ for -)"
        ),
    }
}

/// The file's `key = value` as flags for `arg`, checked by `arg`'s parser (`bare` is the
/// command without variables, so that only these flags are read).
fn as_flags(
    bare: &Command,
    arg: &Arg,
    key: &str,
    value: toml::Value,
) -> anyhow::Result<Vec<OsString>> {
    if !arg.get_action().takes_values() {
        return match value {
            toml::Value::Boolean(true) => Ok(vec![flag(arg).into()]),
            toml::Value::Boolean(false) => Ok(Vec::new()),
            other => bail!("{key} = {other}: write {key} = true or {key} = false"),
        };
    }
    let shown = value.to_string();
    let values = match value {
        toml::Value::Array(items) if is_list(arg) => items,
        toml::Value::Array(_) => bail!("{key} takes one value, not a list"),
        one => vec![one],
    };
    let mut flags = Vec::with_capacity(values.len());
    for value in values {
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            toml::Value::Array(_) | toml::Value::Table(_) => {
                bail!("{key} = {shown}: give plain values")
            }
        };
        flags.push(with_value(arg, OsStr::new(&text)));
    }
    bare.clone()
        .try_get_matches_from(std::iter::once(OsString::from("serve")).chain(flags.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{key} = {shown}: {}", reason(&e)))?;
    Ok(flags)
}

/// What a clap error says, without its `error:` prefix and usage hints.
pub(crate) fn reason(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("For more information") && !l.starts_with("Usage:")
        })
        .collect();
    lines.join("; ").trim_start_matches("error: ").to_owned()
}
