//! The host's interpreters: which Python, Node.js and bash the sandboxes run, found once at
//! start-up, with the directories that must be bound into every sandbox for them to work.
//!
//! Version managers put wrappers on `PATH` (pyenv's shim costs 2.6x on start-up), so Python
//! and Node.js are asked where they really are (`sys.executable` and `sys.prefix`,
//! `process.execPath`) and that is what sandboxes run; a prefix is bound at the same path
//! inside, so compiled-in library paths and the absolute `#!` lines of installed scripts
//! keep working. Any directory others can read works, the host's `/tmp` included (binds
//! there go on top of the sandbox's own `/tmp`); one that cannot (under `/proc`, say) is
//! refused when the backend starts ([`crate::layout::check_binds`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use runbox_core::Language;

/// An interpreter sandboxes can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Path of the program, the same inside the sandbox and on the host.
    pub path: PathBuf,
    /// Its version (`3.11.7`, `20.20.2`, `5.2.15`).
    pub version: String,
    /// Host directories to bind (at the same path) for it to run; empty when it lives
    /// under `/usr`, which every sandbox has.
    pub binds: Vec<PathBuf>,
}

/// What was found for each language.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// CPython.
    pub python: Result<Interpreter, String>,
    /// Node.js.
    pub node: Result<Interpreter, String>,
    /// GNU bash.
    pub bash: Result<Interpreter, String>,
}

/// Where to look, from configuration (`None`: search `PATH`).
#[derive(Debug, Clone, Default)]
pub struct InterpreterPaths {
    /// Python 3 to use.
    pub python: Option<PathBuf>,
    /// Node.js to use.
    pub node: Option<PathBuf>,
    /// bash to use.
    pub bash: Option<PathBuf>,
}

impl Runtime {
    /// Finds the interpreters.
    pub async fn discover(paths: &InterpreterPaths) -> Self {
        let (python, node, bash) = tokio::join!(
            discover_python(paths.python.as_deref()),
            discover_node(paths.node.as_deref()),
            discover_bash(paths.bash.as_deref()),
        );
        Self { python, node, bash }
    }

    /// The interpreter running `language`.
    pub fn for_language(&self, language: Language) -> Result<&Interpreter, &str> {
        let r = match language {
            Language::Python => &self.python,
            Language::JavaScript | Language::TypeScript => &self.node,
            Language::Bash => &self.bash,
        };
        r.as_ref().map_err(String::as_str)
    }

    /// The interpreter running `language`, or the caller's error saying why there is none.
    pub fn require(&self, language: Language) -> Result<&Interpreter, runbox_core::Error> {
        self.for_language(language)
            .map_err(|reason| runbox_core::Error::LanguageUnavailable {
                language,
                reason: reason.to_owned(),
            })
    }

    /// The path of the interpreter for `language`, as text for an argv.
    pub(crate) fn path_of(&self, language: Language) -> Result<String, runbox_core::Error> {
        Ok(self.require(language)?.path.to_string_lossy().into_owned())
    }

    /// Languages that can run.
    pub fn languages(&self) -> Vec<Language> {
        let mut v = Vec::new();
        if self.python.is_ok() {
            v.push(Language::Python);
        }
        if self.node.is_ok() {
            v.push(Language::JavaScript);
            v.push(Language::TypeScript);
        }
        if self.bash.is_ok() {
            v.push(Language::Bash);
        }
        v
    }
}

/// Runs `program args` on the host (never user code: the operator's own interpreter,
/// answering a fixed question) and returns its stdout.
async fn ask(program: &Path, args: &[&str]) -> Result<String, String> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("PYTHONPATH")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), child)
        .await
        .map_err(|_| format!("{} did not answer within 20 s", program.display()))?
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Directories that must be bound for files under `paths`: none under `/usr` (always
/// bound), the path itself otherwise.
fn binds_for(paths: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    for p in paths {
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        if p.starts_with("/usr") || p == Path::new("/") || v.iter().any(|b| p.starts_with(b)) {
            continue;
        }
        v.retain(|b| !b.starts_with(&p));
        v.push(p);
    }
    v
}

const PYTHON_PROBE: &str = "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix); print(sys.version.split()[0])";

async fn discover_python(configured: Option<&Path>) -> Result<Interpreter, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    candidates.extend(configured.map(Path::to_path_buf));
    if configured.is_none() {
        candidates.extend(on_path("python3"));
        candidates.push(PathBuf::from("/usr/bin/python3"));
    }
    let mut errors = Vec::new();
    for candidate in candidates {
        match ask(&candidate, &["-c", PYTHON_PROBE]).await {
            Ok(out) => {
                let lines: Vec<&str> = out.lines().collect();
                let [exe, prefix, base, version] = lines[..] else {
                    errors.push(format!(
                        "{}: unexpected answer {out:?}",
                        candidate.display()
                    ));
                    continue;
                };
                let exe = PathBuf::from(exe);
                if !version.starts_with('3') {
                    errors.push(format!("{}: Python {version}, not 3", candidate.display()));
                    continue;
                }
                return Ok(Interpreter {
                    binds: binds_for([PathBuf::from(base), PathBuf::from(prefix)]),
                    path: exe,
                    version: version.to_owned(),
                });
            }
            Err(e) => errors.push(e),
        }
        if configured.is_some() {
            break;
        }
    }
    Err(if errors.is_empty() {
        "no python3 found on PATH".into()
    } else {
        errors.join("; ")
    })
}

const NODE_PROBE: &str = "console.log(process.execPath); console.log(process.version)";

async fn discover_node(configured: Option<&Path>) -> Result<Interpreter, String> {
    let path = match configured {
        Some(p) => p.to_path_buf(),
        None => on_path("node").ok_or("no node found on PATH")?,
    };
    // Asked where it really is: a version manager's shim is a script that runs another.
    let out = ask(&path, &["-e", NODE_PROBE]).await?;
    let lines: Vec<&str> = out.lines().collect();
    let [exe, version] = lines[..] else {
        return Err(format!("{}: unexpected answer {out:?}", path.display()));
    };
    let exe = std::fs::canonicalize(exe).map_err(|e| format!("{exe}: {e}"))?;
    // An installation (<prefix>/bin/node, as nvm, tool caches and the release tarballs lay
    // it out) keeps node's own modules (npm, corepack) in <prefix>/lib/node_modules: its
    // prefix is bound. A lone binary is bound alone, never the directory it happens to be in.
    let prefix = exe
        .parent()
        .filter(|bin| bin.ends_with("bin"))
        .and_then(Path::parent)
        .filter(|prefix| prefix.join("lib/node_modules").is_dir())
        .map(Path::to_path_buf);
    Ok(Interpreter {
        binds: binds_for(prefix.into_iter().chain([exe.clone()])),
        path: exe,
        version: version.trim().trim_start_matches('v').to_owned(),
    })
}

async fn discover_bash(configured: Option<&Path>) -> Result<Interpreter, String> {
    let path = match configured {
        Some(p) => p.to_path_buf(),
        None => ["/usr/bin/bash", "/bin/bash"]
            .iter()
            .map(PathBuf::from)
            .find(|p| is_executable(p))
            .ok_or("no bash in /usr/bin or /bin")?,
    };
    let out = ask(&path, &["-c", "echo $BASH_VERSION"]).await?;
    let version = out.trim().split('(').next().unwrap_or_default().to_owned();
    let path = std::fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Interpreter {
        // The program alone: bash needs nothing beside it but the system's libraries.
        binds: binds_for([path.clone()]),
        path,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_skip_usr_and_nested_paths() {
        let b = binds_for(
            ["/usr/bin", "/opt/py/3.11", "/opt/py", "/opt/py/3.11/lib"].map(PathBuf::from),
        );
        assert_eq!(b, vec![PathBuf::from("/opt/py")]);
    }

    #[tokio::test]
    async fn a_missing_configured_interpreter_says_which() {
        let err = discover_python(Some(Path::new("/nonexistent/python3")))
            .await
            .unwrap_err();
        assert!(err.contains("/nonexistent/python3"), "{err}");
    }
}
