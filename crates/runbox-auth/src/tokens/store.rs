//! The server's view of the tokens file: verifies presented tokens and follows edits.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};

use super::{TokenFile, has_token_shape, hash_token};
use crate::{AuthError, AuthMethod, Principal, TenantLimits};

/// Verifies bearer tokens against the tokens file, reloading it when it changes.
///
/// Every [`verify`](Self::verify) `stat`s the file (one system call) and compares device,
/// inode, size, and modification and change times to the nanosecond with what it last
/// loaded. Any difference reloads the file, so `runbox token revoke` (which renames a new
/// file into place, giving it a new inode) takes effect on the very next request, without
/// a restart.
///
/// **Fail closed.** If the file disappears, becomes unreadable or stops parsing, no token is
/// accepted until it is fixed; the problem is logged once per change of the file, not once
/// per request.
///
/// `TokenStore` is `Send + Sync`; share it behind an `Arc`.
#[derive(Debug)]
pub struct TokenStore {
    path: PathBuf,
    state: RwLock<State>,
}

/// What was loaded, and from which version of the file.
#[derive(Debug)]
struct State {
    stamp: Stamp,
    tokens: Vec<Stored>,
}

#[derive(Debug)]
struct Stored {
    hash: [u8; 32],
    principal: Principal,
}

/// Identifies one version of the file, as cheaply as `stat` allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    /// There is no file.
    Missing,
    /// `stat` failed for another reason.
    Unreadable(io::ErrorKind),
    /// The file, as of this `stat`.
    File {
        dev: u64,
        ino: u64,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
}

impl Stamp {
    fn of(path: &Path) -> Stamp {
        match fs::metadata(path) {
            Ok(m) => Stamp::File {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Stamp::Missing,
            Err(e) => Stamp::Unreadable(e.kind()),
        }
    }
}

impl TokenStore {
    /// Loads the tokens file at `path`. A missing file means no tokens (yet): the store
    /// picks the file up once it is created. A file that exists but is unreadable or invalid
    /// is an error here, so that a server does not start with a broken configuration.
    pub fn open(path: impl Into<PathBuf>) -> Result<TokenStore, AuthError> {
        let path = path.into();
        let stamp = Stamp::of(&path);
        let file = TokenFile::load(&path)?;
        let tokens = principals(&file);
        tracing::info!(path = %path.display(), tokens = tokens.len(), "loaded tokens file");
        Ok(TokenStore {
            path,
            state: RwLock::new(State { stamp, tokens }),
        })
    }

    /// The tokens file this store follows.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Returns who `presented` authenticates as, or `None` if it is not a valid token.
    ///
    /// The presented value is hashed with SHA-256 and compared with every stored hash in
    /// constant time, without stopping at a match, so the time taken does not depend on
    /// which stored token (if any) it resembles. A value without the `rbx_` prefix or of
    /// the wrong length is refused before that: every real token has that shape, so the
    /// early refusal reveals nothing about the stored tokens.
    pub fn verify(&self, presented: &str) -> Option<Principal> {
        if !has_token_shape(presented) {
            return None;
        }
        let hash = hash_token(presented);
        self.with_current(|state| find(&state.tokens, &hash))
    }

    /// The limits of `tenant`, as the tokens file currently says (reloading it if it
    /// changed, like [`verify`](Self::verify)); `None` if no token has that tenant.
    ///
    /// Limits belong to the tenant: when several of its tokens set the same limit, the
    /// smallest applies, and [`verify`](Self::verify) reports these merged limits too.
    pub fn tenant_limits(&self, tenant: &str) -> Option<TenantLimits> {
        self.with_current(|state| {
            state
                .tokens
                .iter()
                .find(|t| t.principal.tenant == tenant)
                .map(|t| t.principal.limits.clone())
        })
    }

    /// Runs `f` on the loaded tokens, reloading first if the file changed since.
    fn with_current<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        let stamp = Stamp::of(&self.path);
        {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            if state.stamp == stamp {
                return f(&state);
            }
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.stamp != stamp {
            self.reload(&mut state, stamp);
        }
        f(&state)
    }

    /// Replaces the loaded tokens with the file's current content (none on failure).
    fn reload(&self, state: &mut State, stamp: Stamp) {
        let path = self.path.display();
        let was_missing = state.stamp == Stamp::Missing;
        state.tokens = match &stamp {
            Stamp::Missing => {
                if !was_missing {
                    tracing::error!(%path, "tokens file was removed; every token is refused until it is back");
                }
                Vec::new()
            }
            Stamp::Unreadable(kind) => {
                tracing::error!(%path, error = %io::Error::from(*kind), "cannot stat tokens file; every token is refused until it is readable");
                Vec::new()
            }
            Stamp::File { .. } => match TokenFile::load(&self.path) {
                Ok(file) => {
                    let tokens = principals(&file);
                    tracing::info!(%path, tokens = tokens.len(), "reloaded tokens file");
                    tokens
                }
                Err(e) => {
                    tracing::error!(error = %e, "every token is refused until the tokens file is fixed");
                    Vec::new()
                }
            },
        };
        state.stamp = stamp;
    }
}

/// The tokens of `file` with their principals; each tenant's limits merged over all its
/// tokens (the smallest of each limit).
fn principals(file: &TokenFile) -> Vec<Stored> {
    let mut merged: HashMap<&str, TenantLimits> = HashMap::new();
    for e in file.entries() {
        let limits = merged.entry(e.tenant.as_str()).or_default();
        let min = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        limits.max_sandboxes = min(limits.max_sandboxes, e.limits.max_sandboxes);
        limits.max_concurrent_runs = min(limits.max_concurrent_runs, e.limits.max_concurrent_runs);
        limits.requests_per_minute = min(limits.requests_per_minute, e.limits.requests_per_minute);
    }
    file.entries()
        .iter()
        .map(|e| Stored {
            hash: e.hash,
            principal: Principal {
                tenant: e.tenant.clone(),
                limits: merged.get(e.tenant.as_str()).cloned().unwrap_or_default(),
                via: AuthMethod::Token {
                    name: e.name.clone(),
                },
            },
        })
        .collect()
}

/// The token whose hash is `hash`, found by comparing with every stored hash in constant
/// time and without an early exit.
fn find(tokens: &[Stored], hash: &[u8; 32]) -> Option<Principal> {
    let mut found = subtle::Choice::from(0);
    let mut index = 0u64;
    for (i, stored) in (0u64..).zip(tokens) {
        let equal = stored.hash.ct_eq(hash);
        index.conditional_assign(&i, equal);
        found |= equal;
    }
    if bool::from(found) {
        let index = usize::try_from(index).ok()?;
        tokens.get(index).map(|s| s.principal.clone())
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{NewToken, add_token, revoke_token};

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn store_is_send_and_sync() {
        assert_send_sync::<TokenStore>();
    }

    fn new(name: &str, tenant: Option<&str>) -> NewToken {
        NewToken {
            name: name.into(),
            tenant: tenant.map(Into::into),
            limits: TenantLimits::default(),
        }
    }

    #[test]
    fn verifies_added_tokens_with_their_tenant_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let limits = TenantLimits {
            max_sandboxes: Some(5),
            max_concurrent_runs: Some(2),
            requests_per_minute: Some(120),
        };
        let alice = add_token(
            &path,
            NewToken {
                name: "alice-laptop".into(),
                tenant: Some("alice".into()),
                limits: limits.clone(),
            },
        )
        .unwrap();
        let bob = add_token(&path, new("bob", None)).unwrap();
        let store = TokenStore::open(&path).unwrap();

        let p = store.verify(&alice).unwrap();
        assert_eq!(p.tenant, "alice");
        assert_eq!(p.limits, limits);
        assert_eq!(
            p.via,
            AuthMethod::Token {
                name: "alice-laptop".into()
            }
        );
        let p = store.verify(&bob).unwrap();
        assert_eq!(p.tenant, "bob");
        assert_eq!(p.limits, TenantLimits::default());

        // Wrong tokens: same shape but different, truncated, another prefix, empty.
        let mut wrong = alice.clone().into_bytes();
        let last = wrong.len() - 1;
        wrong[last] = if wrong[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(store.verify(&String::from_utf8(wrong).unwrap()), None);
        assert_eq!(store.verify(&alice[..alice.len() - 1]), None);
        assert_eq!(store.verify(&format!("{alice}x")), None);
        assert_eq!(store.verify(&alice.replacen("rbx_", "rbY_", 1)), None);
        assert_eq!(store.verify(""), None);
    }

    #[test]
    fn revoke_on_disk_takes_effect_on_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let a = add_token(&path, new("a", None)).unwrap();
        let b = add_token(&path, new("b", None)).unwrap();
        let store = TokenStore::open(&path).unwrap();
        assert!(store.verify(&a).is_some());

        // Immediately, with no sleep: the rename gives the file a new inode.
        revoke_token(&path, "a").unwrap();
        assert_eq!(store.verify(&a), None);
        assert_eq!(store.verify(&b).unwrap().tenant, "b");

        // And a token added after the store opened is accepted.
        let c = add_token(&path, new("c", Some("carol"))).unwrap();
        assert_eq!(store.verify(&c).unwrap().tenant, "carol");
    }

    #[test]
    fn limits_belong_to_the_tenant_and_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let limited = |s: Option<u32>, r: Option<u32>| TenantLimits {
            max_sandboxes: s,
            max_concurrent_runs: None,
            requests_per_minute: r,
        };
        let laptop = add_token(
            &path,
            NewToken {
                name: "alice-laptop".into(),
                tenant: Some("alice".into()),
                limits: limited(Some(5), None),
            },
        )
        .unwrap();
        let ci = add_token(
            &path,
            NewToken {
                name: "alice-ci".into(),
                tenant: Some("alice".into()),
                limits: limited(Some(3), Some(60)),
            },
        )
        .unwrap();
        let store = TokenStore::open(&path).unwrap();
        let merged = limited(Some(3), Some(60));
        assert_eq!(store.tenant_limits("alice"), Some(merged.clone()));
        assert_eq!(store.verify(&laptop).unwrap().limits, merged);
        assert_eq!(store.verify(&ci).unwrap().limits, merged);
        assert_eq!(store.tenant_limits("bob"), None);

        revoke_token(&path, "alice-ci").unwrap();
        assert_eq!(store.tenant_limits("alice"), Some(limited(Some(5), None)));
        revoke_token(&path, "alice-laptop").unwrap();
        assert_eq!(store.tenant_limits("alice"), None);
    }

    #[test]
    fn a_same_size_replacement_within_the_same_second_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut first = TokenFile::default();
        let a = first.add(new("a", None)).unwrap();
        first.save(&path).unwrap();
        let store = TokenStore::open(&path).unwrap();
        assert!(store.verify(&a).is_some());

        // Same length of text, written straight away: the size and (most likely) the
        // whole-second mtime are unchanged; the new inode and the nanoseconds are not.
        let mut second = TokenFile::default();
        let b = second.add(new("b", None)).unwrap();
        second.save(&path).unwrap();
        assert_eq!(first.to_toml().len(), second.to_toml().len());
        assert_eq!(store.verify(&a), None);
        assert_eq!(store.verify(&b).unwrap().tenant, "b");
    }

    #[test]
    fn a_broken_file_refuses_everything_until_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let a = add_token(&path, new("a", None)).unwrap();
        let store = TokenStore::open(&path).unwrap();
        assert!(store.verify(&a).is_some());
        let good = fs::read_to_string(&path).unwrap();

        // Overwritten in place (same inode) with garbage.
        fs::write(&path, "this is [not toml").unwrap();
        assert_eq!(store.verify(&a), None);
        assert_eq!(store.verify(&a), None);

        // A typo in a field also fails closed.
        fs::write(&path, good.replace("tenant =", "tenantt =")).unwrap();
        assert_eq!(store.verify(&a), None);

        fs::write(&path, &good).unwrap();
        assert!(store.verify(&a).is_some());

        fs::remove_file(&path).unwrap();
        assert_eq!(store.verify(&a), None);
    }

    #[test]
    fn a_missing_file_is_empty_and_picked_up_when_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("later/tokens.toml");
        let store = TokenStore::open(&path).unwrap();
        let stray = format!("rbx_{}", "A".repeat(43));
        assert_eq!(store.verify(&stray), None);

        let a = add_token(&path, new("a", None)).unwrap();
        assert_eq!(store.verify(&a).unwrap().tenant, "a");
    }

    #[test]
    fn open_refuses_an_invalid_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        fs::write(&path, "[[token]]\nname = \"a\"\n").unwrap();
        let err = TokenStore::open(&path).unwrap_err();
        assert!(err.to_string().contains("missing field `hash`"), "{err}");
    }

    #[test]
    fn find_picks_the_matching_entry_among_many() {
        let tokens: Vec<Stored> = (0..10u8)
            .map(|i| Stored {
                hash: hash_token(&i.to_string()),
                principal: Principal {
                    tenant: format!("t{i}"),
                    limits: TenantLimits::default(),
                    via: AuthMethod::Token {
                        name: format!("n{i}"),
                    },
                },
            })
            .collect();
        for i in 0..10u8 {
            assert_eq!(
                find(&tokens, &hash_token(&i.to_string())).unwrap().tenant,
                format!("t{i}")
            );
        }
        assert_eq!(find(&tokens, &hash_token("10")), None);
        assert_eq!(find(&[], &hash_token("0")), None);
    }
}
