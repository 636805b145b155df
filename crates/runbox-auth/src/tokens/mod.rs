//! The bearer-token file: what `runbox token add|list|revoke` edit and the server reads.
//!
//! A token is `rbx_` followed by 32 random bytes in unpadded base64url (47 characters in
//! all). It is shown once, when it is created; the file keeps only its SHA-256 hash:
//!
//! ```toml
//! [[token]]
//! name = "alice-laptop"              # unique; what `revoke` takes
//! tenant = "alice"                   # defaults to the name
//! hash = "sha256:9f86d081884c7d65…"  # of the whole token, `rbx_` included
//! created = "2026-11-23T04:30:00Z"
//! max_sandboxes = 5                  # optional per-tenant limits
//! max_concurrent_runs = 2
//! requests_per_minute = 120
//! ```
//!
//! **Why a fast, unsalted hash is right here.** Slow salted hashes (argon2, bcrypt) exist
//! for passwords, which people choose and which are guessable: they make each guess
//! expensive. These tokens are not chosen by people: each has 256 bits from the operating
//! system's random number generator, so a leaked file gives an attacker nothing to guess
//! against; no amount of hashing speed makes 2^256 tries feasible, and salting protects
//! against precomputed tables that cannot exist for such inputs. A fast hash also keeps
//! verification cheap enough to run on every request.
//!
//! Unknown fields are refused, so a typo such as `tenantt` is an error rather than a
//! silently ignored limit. Rewriting the file (`add`, `revoke`) does not keep comments.

mod store;

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest as _, Sha256};

pub use store::TokenStore;

use crate::{AuthError, TenantLimits};

/// What every token starts with, so that a token is recognisable in a leaked log or a
/// secret scanner, and so that other strings can be rejected without hashing.
pub const TOKEN_PREFIX: &str = "rbx_";

/// How many random bytes a token carries.
const TOKEN_BYTES: usize = 32;

/// The length of a token: the prefix and 32 bytes in unpadded base64 (43 characters).
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + (TOKEN_BYTES * 4).div_ceil(3);

/// The prefix of a stored hash.
const HASH_PREFIX: &str = "sha256:";

/// The longest name or tenant.
const MAX_NAME_LEN: usize = 64;

/// One token in the file, as `runbox token list` shows it. The token itself is not known:
/// only its hash is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    /// The token's unique name (what `revoke` takes).
    pub name: String,
    /// The tenant the token acts for.
    pub tenant: String,
    /// When the token was created, as written in the file (RFC 3339, UTC), if recorded.
    pub created: Option<String>,
    /// The tenant's limits set on this token.
    pub limits: TenantLimits,
    /// SHA-256 of the token.
    hash: [u8; 32],
}

/// What `add` needs to create a token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewToken {
    /// The token's name: unique in the file, 1–64 characters of `[A-Za-z0-9._-]`.
    pub name: String,
    /// The tenant; the name when `None`. Same character rules as the name.
    pub tenant: Option<String>,
    /// Limits for the tenant.
    pub limits: TenantLimits,
}

/// The tokens file in memory. Load it, change it, save it; or use [`add_token`] and
/// [`revoke_token`], which do that under a lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenFile {
    entries: Vec<TokenEntry>,
}

impl TokenFile {
    /// Reads the tokens file at `path`. A missing file is an empty one; anything else that
    /// is wrong with it (unreadable, bad TOML, unknown fields, invalid or duplicate names)
    /// is an error naming the file and, where it can, the line.
    pub fn load(path: impl AsRef<Path>) -> Result<TokenFile, AuthError> {
        let path = path.as_ref();
        match fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(TokenFile::default()),
            Err(source) => Err(AuthError::Read {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Parses the text of a tokens file; `path` is only used in error messages.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<TokenFile, AuthError> {
        let parse_error =
            |span: Option<std::ops::Range<usize>>, message: String| AuthError::Parse {
                path: path.to_owned(),
                line: span.map(|s| line_of(text, s.start)),
                message,
            };
        let raw: RawFile =
            toml::from_str(text).map_err(|e| parse_error(e.span(), e.message().to_owned()))?;
        let mut entries: Vec<TokenEntry> = Vec::with_capacity(raw.token.len());
        for record in raw.token {
            let span = record.name.span();
            let name = record.name.into_inner().0;
            if entries.iter().any(|e| e.name == name) {
                return Err(parse_error(
                    Some(span),
                    format!("a second token is named {name:?}; names must be unique"),
                ));
            }
            let hash = record.hash.0;
            if let Some(twin) = entries.iter().find(|e| e.hash == hash) {
                return Err(parse_error(
                    Some(span),
                    format!(
                        "token {name:?} has the same hash as token {:?}; one token cannot belong to two entries",
                        twin.name
                    ),
                ));
            }
            entries.push(TokenEntry {
                tenant: record.tenant.map_or_else(|| name.clone(), |t| t.0),
                name,
                created: record.created,
                limits: TenantLimits {
                    max_sandboxes: record.max_sandboxes,
                    max_concurrent_runs: record.max_concurrent_runs,
                    requests_per_minute: record.requests_per_minute,
                },
                hash,
            });
        }
        Ok(TokenFile { entries })
    }

    /// The tokens, in file order.
    pub fn entries(&self) -> &[TokenEntry] {
        &self.entries
    }

    /// The token named `name`, if any.
    pub fn get(&self, name: &str) -> Option<&TokenEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Creates a token and adds its hash to the file (in memory: call [`save`](Self::save)).
    /// Returns the token, which is not stored anywhere and so cannot be shown again.
    ///
    /// Errors: an invalid name or tenant, a name already in the file, or no randomness.
    pub fn add(&mut self, new: NewToken) -> Result<String, AuthError> {
        validate_name("name", &new.name)?;
        if let Some(tenant) = &new.tenant {
            validate_name("tenant", tenant)?;
        }
        if self.get(&new.name).is_some() {
            return Err(AuthError::DuplicateName(new.name));
        }
        let token = generate_token()?;
        self.entries.push(TokenEntry {
            tenant: new.tenant.unwrap_or_else(|| new.name.clone()),
            name: new.name,
            created: Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string()),
            limits: new.limits,
            hash: hash_token(&token),
        });
        Ok(token)
    }

    /// Removes the token named `name` (in memory: call [`save`](Self::save)).
    ///
    /// Errors: no token has that name.
    pub fn revoke(&mut self, name: &str) -> Result<(), AuthError> {
        let before = self.entries.len();
        self.entries.retain(|e| e.name != name);
        if self.entries.len() == before {
            return Err(AuthError::UnknownName(name.to_owned()));
        }
        Ok(())
    }

    /// The file's text, as [`save`](Self::save) writes it.
    pub fn to_toml(&self) -> String {
        let raw = RawFileOut {
            token: self
                .entries
                .iter()
                .map(|e| RawTokenOut {
                    name: &e.name,
                    tenant: &e.tenant,
                    hash: format!("{HASH_PREFIX}{}", to_hex(&e.hash)),
                    created: e.created.as_deref(),
                    max_sandboxes: e.limits.max_sandboxes,
                    max_concurrent_runs: e.limits.max_concurrent_runs,
                    requests_per_minute: e.limits.requests_per_minute,
                })
                .collect(),
        };
        let body = match toml::to_string(&raw) {
            Ok(body) => body,
            // Strings and integers always serialize; keep the file empty rather than panic.
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize the tokens file");
                String::new()
            }
        };
        format!(
            "# runbox bearer tokens, managed by `runbox token add|list|revoke`.\n\
             # Only SHA-256 hashes of the tokens are stored here.\n\n{body}"
        )
    }

    /// Writes the file atomically: to a temporary file (mode 0600) in the same folder,
    /// flushed to disk, then renamed over `path`, so that a reader sees the old file or the
    /// new one, never half of one. Creates the folder (mode 0700) if it is missing.
    ///
    /// This does not lock: two processes saving at once may lose one's changes. Use
    /// [`add_token`] and [`revoke_token`] for read-modify-write.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), AuthError> {
        write_atomically(path.as_ref(), self.to_toml().as_bytes())
    }
}

/// Creates a token in the file at `path` and returns it: loads the file, adds the token,
/// and saves, all under an exclusive lock on `PATH.lock` so that concurrent `add_token` and
/// [`revoke_token`] calls (from any process) all take effect.
pub fn add_token(path: impl AsRef<Path>, new: NewToken) -> Result<String, AuthError> {
    let path = path.as_ref();
    let _lock = lock(path)?;
    let mut file = TokenFile::load(path)?;
    let token = file.add(new)?;
    file.save(path)?;
    Ok(token)
}

/// Removes the token named `name` from the file at `path`, under the same lock as
/// [`add_token`]. A running server's [`TokenStore`] refuses the token from its next
/// request on.
pub fn revoke_token(path: impl AsRef<Path>, name: &str) -> Result<(), AuthError> {
    let path = path.as_ref();
    let _lock = lock(path)?;
    let mut file = TokenFile::load(path)?;
    file.revoke(name)?;
    file.save(path)
}

/// Where the tokens file lives by default: `$RUNBOX_TOKENS` if set, else
/// `$XDG_CONFIG_HOME/runbox/tokens.toml`, else `$HOME/.config/runbox/tokens.toml`.
/// Empty variables count as unset, and a relative `XDG_CONFIG_HOME` is ignored, as the
/// XDG specification says.
pub fn default_token_path() -> Result<PathBuf, AuthError> {
    token_path_from(
        std::env::var_os("RUNBOX_TOKENS"),
        std::env::var_os("XDG_CONFIG_HOME"),
        std::env::var_os("HOME"),
    )
}

/// [`default_token_path`] with the environment passed in.
fn token_path_from(
    runbox_tokens: Option<std::ffi::OsString>,
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf, AuthError> {
    let set = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(path) = set(runbox_tokens) {
        return Ok(path);
    }
    if let Some(config) = set(xdg_config_home).filter(|p| p.is_absolute()) {
        return Ok(config.join("runbox").join("tokens.toml"));
    }
    if let Some(home) = set(home) {
        return Ok(home.join(".config").join("runbox").join("tokens.toml"));
    }
    Err(AuthError::NoTokenPath)
}

/// Checks a name or tenant: 1–64 characters of `[A-Za-z0-9._-]`.
fn validate_name(what: &'static str, value: &str) -> Result<(), AuthError> {
    if is_valid_name(value) {
        Ok(())
    } else {
        Err(AuthError::InvalidName {
            what,
            value: value.to_owned(),
        })
    }
}

fn is_valid_name(value: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new random token.
fn generate_token() -> Result<String, AuthError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// SHA-256 of a token, as stored.
pub(crate) fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Whether `presented` has the shape of a token (prefix and length). Checking this before
/// hashing tells a caller nothing about the stored tokens: every token has this shape.
pub(crate) fn has_token_shape(presented: &str) -> bool {
    presented.len() == TOKEN_LEN && presented.starts_with(TOKEN_PREFIX)
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Parses `sha256:` and 64 hex digits (either case).
fn parse_stored_hash(value: &str) -> Option<[u8; 32]> {
    let hex = value.strip_prefix(HASH_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()
        .iter()
        .take(offset)
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The file as written: `[[token]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    token: Vec<RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: toml::Spanned<Name>,
    #[serde(default)]
    tenant: Option<Name>,
    hash: StoredHash,
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    max_sandboxes: Option<u32>,
    #[serde(default)]
    max_concurrent_runs: Option<u32>,
    #[serde(default)]
    requests_per_minute: Option<u32>,
}

/// The file as [`TokenFile::to_toml`] writes it.
#[derive(Serialize)]
struct RawFileOut<'a> {
    token: Vec<RawTokenOut<'a>>,
}

#[derive(Serialize)]
struct RawTokenOut<'a> {
    name: &'a str,
    tenant: &'a str,
    hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_sandboxes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_concurrent_runs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    requests_per_minute: Option<u32>,
}

/// A name or tenant, checked as it is read so that the error points at its line.
struct Name(String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        if is_valid_name(&value) {
            Ok(Name(value))
        } else {
            Err(serde::de::Error::custom(format!(
                "invalid name or tenant {value:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-'"
            )))
        }
    }
}

/// `sha256:` and 64 hex digits, checked as it is read.
struct StoredHash([u8; 32]);

impl<'de> Deserialize<'de> for StoredHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        parse_stored_hash(&value).map(StoredHash).ok_or_else(|| {
            serde::de::Error::custom("invalid hash: expected \"sha256:\" and 64 hexadecimal digits")
        })
    }
}

/// Takes the exclusive lock on `PATH.lock`, creating the folder and the lock file if
/// needed. The lock lasts as long as the returned file is open.
fn lock(path: &Path) -> Result<File, AuthError> {
    let lock_path = sibling(path, ".lock");
    let write_error = |source| AuthError::Write {
        path: lock_path.clone(),
        source,
    };
    create_parent(path)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(write_error)?;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(write_error(e.into())),
        }
    }
}

/// `path` with `suffix` appended to its file name (`tokens.toml` → `tokens.toml.lock`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    path.with_file_name(name)
}

/// The folder `path` is in (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates the folder `path` is in, mode 0700, if it is missing.
fn create_parent(path: &Path) -> Result<(), AuthError> {
    let dir = parent_of(path);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| AuthError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// Replaces `path` with `contents` so that readers see either the old file or the new one.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), AuthError> {
    if path.file_name().is_none() {
        return Err(AuthError::Write {
            path: path.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
        });
    }
    create_parent(path)?;
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| AuthError::Random(e.to_string()))?;
    let temp = sibling(
        path,
        &format!(".tmp-{}-{}", std::process::id(), to_hex(&nonce)),
    );
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&temp);
        return Err(AuthError::Write {
            path: path.to_owned(),
            source,
        });
    }
    // Make the rename itself durable. The new file is in place either way, so a failure
    // here is worth a warning, not an error.
    if let Err(e) = File::open(parent_of(path)).and_then(|dir| dir.sync_all()) {
        tracing::warn!(path = %path.display(), error = %e, "cannot sync the tokens file's folder");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Arc;

    use super::*;

    fn limits() -> TenantLimits {
        TenantLimits {
            max_sandboxes: Some(5),
            max_concurrent_runs: Some(2),
            requests_per_minute: Some(120),
        }
    }

    #[test]
    fn tokens_have_the_documented_shape_and_differ() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_ne!(a, b);
        for t in [&a, &b] {
            assert_eq!(t.len(), TOKEN_LEN);
            assert_eq!(TOKEN_LEN, 47);
            assert!(t.starts_with("rbx_"));
            assert!(has_token_shape(t));
            let body = URL_SAFE_NO_PAD.decode(&t[4..]).unwrap();
            assert_eq!(body.len(), 32);
        }
        assert!(!has_token_shape("rbx_short"));
        assert!(!has_token_shape(&a.replacen("rbx_", "xyz_", 1)));
    }

    #[test]
    fn hash_is_sha256_of_the_whole_token() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            to_hex(&hash_token("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let h = hash_token("abc");
        assert_eq!(
            parse_stored_hash(&format!("sha256:{}", to_hex(&h).to_uppercase())),
            Some(h)
        );
        assert_eq!(parse_stored_hash("sha256:abcd"), None);
        assert_eq!(parse_stored_hash(&format!("md5:{}", to_hex(&h))), None);
        assert_eq!(
            parse_stored_hash(&format!("sha256:{}", "g".repeat(64))),
            None
        );
    }

    #[test]
    fn add_save_load_round_trips_and_stores_only_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/runbox/tokens.toml");
        let mut file = TokenFile::default();
        let token = file
            .add(NewToken {
                name: "alice-laptop".into(),
                tenant: Some("alice".into()),
                limits: limits(),
            })
            .unwrap();
        file.add(NewToken {
            name: "bob".into(),
            ..NewToken::default()
        })
        .unwrap();
        file.save(&path).unwrap();

        let text = fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains(&token),
            "the token itself must not be stored"
        );
        assert!(text.contains(&format!("sha256:{}", to_hex(&hash_token(&token)))));
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);

        let loaded = TokenFile::load(&path).unwrap();
        assert_eq!(loaded, file);
        let alice = loaded.get("alice-laptop").unwrap();
        assert_eq!(alice.tenant, "alice");
        assert_eq!(alice.limits, limits());
        let created = alice.created.as_deref().unwrap();
        humantime::parse_rfc3339(created).unwrap();
        assert!(created.ends_with('Z'));
        let bob = loaded.get("bob").unwrap();
        assert_eq!(bob.tenant, "bob", "tenant defaults to the name");
        assert_eq!(bob.limits, TenantLimits::default());
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = TokenFile::load(dir.path().join("absent.toml")).unwrap();
        assert!(file.entries().is_empty());
    }

    #[test]
    fn add_refuses_duplicates_and_bad_names() {
        let mut file = TokenFile::default();
        file.add(NewToken {
            name: "a".into(),
            ..NewToken::default()
        })
        .unwrap();
        let dup = file
            .add(NewToken {
                name: "a".into(),
                ..NewToken::default()
            })
            .unwrap_err();
        assert!(
            matches!(dup, AuthError::DuplicateName(ref n) if n == "a"),
            "{dup}"
        );

        for bad in ["", "has space", "slash/", "é", &"x".repeat(65)] {
            let err = file
                .add(NewToken {
                    name: bad.into(),
                    ..NewToken::default()
                })
                .unwrap_err();
            assert!(
                matches!(err, AuthError::InvalidName { what: "name", .. }),
                "{bad:?}: {err}"
            );
        }
        let err = file
            .add(NewToken {
                name: "ok".into(),
                tenant: Some("not ok".into()),
                ..NewToken::default()
            })
            .unwrap_err();
        assert!(matches!(err, AuthError::InvalidName { what: "tenant", .. }));
        assert!(err.to_string().contains("1 to 64 characters"), "{err}");
        file.add(NewToken {
            name: "A.b_c-9".repeat(9).chars().take(64).collect(),
            ..NewToken::default()
        })
        .unwrap();
        assert_eq!(file.entries().len(), 2);
    }

    #[test]
    fn revoke_removes_and_refuses_unknown_names() {
        let mut file = TokenFile::default();
        for name in ["a", "b"] {
            file.add(NewToken {
                name: name.into(),
                ..NewToken::default()
            })
            .unwrap();
        }
        file.revoke("a").unwrap();
        assert!(file.get("a").is_none());
        assert!(file.get("b").is_some());
        let err = file.revoke("a").unwrap_err();
        assert!(matches!(err, AuthError::UnknownName(ref n) if n == "a"));
    }

    fn parse_err(text: &str) -> String {
        TokenFile::parse(text, Path::new("/x/tokens.toml"))
            .unwrap_err()
            .to_string()
    }

    const HASH: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn unknown_fields_are_refused_with_path_and_line() {
        let msg = parse_err(&format!(
            "[[token]]\nname = \"a\"\ntenantt = \"alice\"\nhash = \"{HASH}\"\n"
        ));
        assert!(
            msg.starts_with("tokens file /x/tokens.toml, line 3: unknown field `tenantt`"),
            "{msg}"
        );
        let msg = parse_err("[[tokens]]\nname = \"a\"\n");
        assert!(msg.contains("line 1"), "{msg}");
        assert!(msg.contains("unknown field `tokens`"), "{msg}");
    }

    #[test]
    fn invalid_values_point_at_their_line() {
        let msg = parse_err(&format!(
            "[[token]]\nname = \"a\"\nhash = \"{HASH}\"\n\n[[token]]\nname = \"b c\"\nhash = \"{HASH}\"\n"
        ));
        assert!(msg.contains("line 6"), "{msg}");
        assert!(msg.contains("invalid name or tenant \"b c\""), "{msg}");

        let msg = parse_err("[[token]]\nname = \"a\"\nhash = \"sha256:00\"\n");
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.contains("invalid hash"), "{msg}");

        let msg = parse_err(&format!(
            "[[token]]\nname = \"a\"\nhash = \"{HASH}\"\nmax_sandboxes = -1\n"
        ));
        assert!(msg.contains("line 4"), "{msg}");

        let msg = parse_err("[[token]]\nname = \"a\"\n");
        assert!(msg.contains("missing field `hash`"), "{msg}");

        let msg = parse_err("[[token]\n");
        assert!(
            msg.starts_with("tokens file /x/tokens.toml, line 1:"),
            "{msg}"
        );
    }

    #[test]
    fn duplicate_names_and_hashes_in_the_file_are_refused() {
        let other = format!("sha256:{}", "0".repeat(64));
        let msg = parse_err(&format!(
            "[[token]]\nname = \"a\"\nhash = \"{HASH}\"\n[[token]]\nname = \"a\"\nhash = \"{other}\"\n"
        ));
        assert!(msg.contains("line 5"), "{msg}");
        assert!(msg.contains("names must be unique"), "{msg}");
        let msg = parse_err(&format!(
            "[[token]]\nname = \"a\"\nhash = \"{HASH}\"\n[[token]]\nname = \"b\"\nhash = \"{HASH}\"\n"
        ));
        assert!(msg.contains("same hash"), "{msg}");
    }

    #[test]
    fn hand_written_files_are_accepted() {
        let file = TokenFile::parse(
            &format!(
                "# comment\n[[token]]\nname = \"ci\"\nhash = \"{HASH}\"\nrequests_per_minute = 10\n"
            ),
            Path::new("t.toml"),
        )
        .unwrap();
        let e = &file.entries()[0];
        assert_eq!((e.name.as_str(), e.tenant.as_str()), ("ci", "ci"));
        assert_eq!(e.created, None);
        assert_eq!(e.limits.requests_per_minute, Some(10));
        assert_eq!(e.limits.max_sandboxes, None);
        assert!(
            TokenFile::parse("", Path::new("t.toml"))
                .unwrap()
                .entries()
                .is_empty()
        );
    }

    #[test]
    fn concurrent_add_token_calls_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = Arc::new(dir.path().join("cfg/tokens.toml"));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let path = Arc::clone(&path);
                std::thread::spawn(move || {
                    (0..4)
                        .map(|j| {
                            add_token(
                                &*path,
                                NewToken {
                                    name: format!("t{i}-{j}"),
                                    ..NewToken::default()
                                },
                            )
                            .unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let tokens: Vec<String> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let file = TokenFile::load(&*path).unwrap();
        assert_eq!(file.entries().len(), 32, "every concurrent add must land");
        for token in &tokens {
            let h = hash_token(token);
            assert!(file.entries().iter().any(|e| e.hash == h));
        }
        // No temporary files are left behind; the lock file stays.
        let mut names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["tokens.toml", "tokens.toml.lock"]);
    }

    #[test]
    fn revoke_token_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        add_token(
            &path,
            NewToken {
                name: "a".into(),
                ..NewToken::default()
            },
        )
        .unwrap();
        revoke_token(&path, "a").unwrap();
        assert!(TokenFile::load(&path).unwrap().entries().is_empty());
        let err = revoke_token(&path, "a").unwrap_err();
        assert_eq!(err.to_string(), "no token named \"a\"");
    }

    #[test]
    fn default_path_follows_the_environment() {
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        assert_eq!(
            token_path_from(os("/etc/rb.toml"), os("/xdg"), os("/home/u")).unwrap(),
            PathBuf::from("/etc/rb.toml")
        );
        assert_eq!(
            token_path_from(os(""), os("/xdg"), os("/home/u")).unwrap(),
            PathBuf::from("/xdg/runbox/tokens.toml")
        );
        assert_eq!(
            token_path_from(None, os("relative"), os("/home/u")).unwrap(),
            PathBuf::from("/home/u/.config/runbox/tokens.toml")
        );
        assert!(matches!(
            token_path_from(None, None, None),
            Err(AuthError::NoTokenPath)
        ));
    }

    #[test]
    fn odd_created_values_survive_a_round_trip() {
        let text =
            format!("[[token]]\nname = \"a\"\nhash = \"{HASH}\"\ncreated = \"x\\\"y\\u007f\\n\"\n");
        let file = TokenFile::parse(&text, Path::new("t.toml")).unwrap();
        assert_eq!(file.entries()[0].created.as_deref(), Some("x\"y\u{7f}\n"));
        let again = TokenFile::parse(&file.to_toml(), Path::new("t.toml")).unwrap();
        assert_eq!(again, file);
    }
}
