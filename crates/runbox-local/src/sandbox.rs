//! One local sandbox: its jail, its kernels (started on first use) and its bash state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use runbox_core::{
    CommandRequest, Error, ExecContext, ExecOutcome, ExecRequest, InstallRequest, Language, Limits,
    PackageManager, SandboxId,
};
use runbox_jail::{Jail, SpawnRequest};
use tokio::sync::Mutex;

use crate::files::FileAreas;
use crate::kernel::bash::{self, BashState};
use crate::kernel::{Kernel, KernelError, spawn_failed};
use crate::layout::{NODE_DRIVER, PYTHON_DRIVER, PYTHON_PACKAGES};
use crate::process::Processes;
use crate::runtime::Runtime;
use crate::transpile::{self, SyntaxError};

/// The outcome of TypeScript that does not parse: nothing ran.
fn syntax_error_outcome(e: SyntaxError) -> ExecOutcome {
    ExecOutcome {
        error: Some(runbox_core::ExecError {
            name: "SyntaxError".into(),
            value: format!("{} (line {}, column {})", e.message, e.line, e.column),
            traceback: e.rendered,
        }),
        ..Default::default()
    }
}

/// Most packages one install takes.
const MAX_PACKAGES: usize = 64;

/// Package specifications must be names (with versions or extras), not options or files.
fn check_packages(packages: &[String]) -> Result<(), Error> {
    if packages.is_empty() {
        return Err(Error::InvalidRequest(
            "packages is empty: name at least one".into(),
        ));
    }
    if packages.len() > MAX_PACKAGES {
        return Err(Error::InvalidRequest(format!(
            "{} packages asked for; install at most {MAX_PACKAGES} at a time",
            packages.len()
        )));
    }
    for p in packages {
        if p.trim().is_empty() || p.len() > 512 || p.contains(['\0', '\n', '\r']) {
            return Err(Error::InvalidRequest(format!(
                "{p:?} is not a package specification"
            )));
        }
        if p.starts_with('-') {
            return Err(Error::InvalidRequest(format!(
                "{p:?} looks like an option; give package names (with versions, such as \
                 requests==2.32 or lodash@4) only"
            )));
        }
    }
    Ok(())
}

/// A kernel, or the memory that one was lost (so the next run can say it started afresh).
#[derive(Debug, Default)]
struct KernelSlot {
    kernel: Option<Kernel>,
    lost: bool,
}

/// Settings shared by every run of a sandbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSettings {
    pub(crate) kernel_start_timeout: Duration,
    pub(crate) interrupt_grace: Duration,
}

#[derive(Debug)]
pub(crate) struct LocalSandbox {
    pub(crate) id: SandboxId,
    pub(crate) jail: Jail,
    pub(crate) created_at: SystemTime,
    pub(crate) limits: Limits,
    /// What the file tools reach.
    pub(crate) files: Arc<FileAreas>,
    /// `KEY=VALUE` every kernel starts with: the base environment plus the caller's.
    env: Vec<String>,
    python: Mutex<KernelSlot>,
    node: Mutex<KernelSlot>,
    bash: Mutex<BashState>,
    /// Commands running in the background.
    pub(crate) processes: Processes,
    /// The egress proxy, for a sandbox with network access (stopped when dropped).
    pub(crate) egress: Option<runbox_egress::EgressHandle>,
}

impl LocalSandbox {
    pub(crate) fn new(
        id: SandboxId,
        jail: Jail,
        files: FileAreas,
        limits: Limits,
        env: std::collections::BTreeMap<String, String>,
        egress: Option<runbox_egress::EgressHandle>,
    ) -> Self {
        Self {
            id,
            jail,
            files: Arc::new(files),
            created_at: SystemTime::now(),
            limits,
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            python: Mutex::default(),
            node: Mutex::default(),
            bash: Mutex::new(BashState::new(env)),
            processes: Processes::default(),
            egress,
        }
    }

    fn slot(&self, language: Language) -> Option<&Mutex<KernelSlot>> {
        match language {
            Language::Python => Some(&self.python),
            // TypeScript is transpiled and runs in the JavaScript kernel: they share state.
            Language::JavaScript | Language::TypeScript => Some(&self.node),
            Language::Bash => None,
        }
    }

    /// Languages with a kernel running now.
    pub(crate) fn kernels(&self) -> Vec<Language> {
        [Language::Python, Language::JavaScript]
            .into_iter()
            .filter(|&lang| match self.slot(lang).map(Mutex::try_lock) {
                Some(Ok(mut s)) => s.kernel.as_mut().is_some_and(Kernel::is_alive),
                // Busy running code: certainly alive.
                Some(Err(_)) => true,
                None => false,
            })
            .collect()
    }

    /// Starts the kernel for `language` if it is not running; returns its version.
    pub(crate) async fn ensure_kernel(
        &self,
        runtime: &Runtime,
        language: Language,
        settings: RunSettings,
    ) -> Result<String, Error> {
        let Some(slot) = self.slot(language) else {
            return Err(Error::InvalidRequest(format!(
                "{language} has no persistent kernel"
            )));
        };
        let mut slot = slot.lock().await;
        self.live_kernel(&mut slot, runtime, language, settings)
            .await
            .map(|k| k.version().to_owned())
    }

    async fn live_kernel<'a>(
        &self,
        slot: &'a mut KernelSlot,
        runtime: &Runtime,
        language: Language,
        settings: RunSettings,
    ) -> Result<&'a mut Kernel, Error> {
        if slot.kernel.as_mut().is_some_and(|k| !k.is_alive()) {
            slot.kernel = None;
            slot.lost = true;
        }
        if slot.kernel.is_none() {
            let interpreter = runtime.require(language)?;
            let path = interpreter.path.to_string_lossy().into_owned();
            let argv = match language {
                Language::Python => vec![path, PYTHON_DRIVER.into()],
                _ => vec![path, "--expose-internals".into(), NODE_DRIVER.into()],
            };
            let kernel = Kernel::start(
                &self.jail,
                language,
                argv,
                self.env.clone(),
                settings.kernel_start_timeout,
            )
            .await
            .map_err(|e| match e {
                KernelError::Spawn { source, .. } => {
                    spawn_failed(source, &format!("the {language} kernel"), self.limits.pids)
                }
                e => Error::sandbox_caused_by(format!("sandbox {}", self.id), e),
            })?;
            slot.kernel = Some(kernel);
        }
        slot.kernel
            .as_mut()
            .ok_or_else(|| Error::sandbox("kernel vanished"))
    }

    /// Whether `language`'s interpreter, when one was found, starts in this sandbox; `Err`
    /// says why not and what to do.
    pub(crate) async fn check_interpreter(
        &self,
        runtime: &Runtime,
        language: Language,
        grace: Duration,
    ) -> Result<(), String> {
        let Ok(interpreter) = runtime.for_language(language) else {
            return Ok(());
        };
        let path = interpreter.path.to_string_lossy().into_owned();
        let (name, flag, args): (&str, &str, &[&str]) = match language {
            Language::Python => ("Python", "python", &["-c", "pass"]),
            Language::Bash => ("bash", "bash", &["-c", ":"]),
            Language::JavaScript | Language::TypeScript => ("Node.js", "node", &["--version"]),
        };
        let spawn = SpawnRequest {
            argv: std::iter::once(path.clone())
                .chain(args.iter().map(|a| (*a).to_owned()))
                .collect(),
            env: self.env.clone(),
            cwd: "/workspace".into(),
        };
        let fix = format!(
            "sandboxes run it as an unprivileged user that sees only /usr, /lib and its own \
             directories of the host, read-only: make it and every directory above it readable \
             by others (chmod o+rx), or choose another with --{flag} PATH (RUNBOX_{})",
            flag.to_uppercase()
        );
        let ctx = ExecContext::default();
        let ran = bash::run_shell(
            &self.jail,
            spawn,
            false,
            Duration::from_secs(30),
            &ctx,
            &self.limits,
            grace,
        )
        .await;
        match ran {
            Ok((o, _)) if o.exit_code == Some(0) => Ok(()),
            Ok((o, _)) => Err(format!(
                "the {name} at {path} does not run in a sandbox ({}: {}); {fix}",
                o.exit_code
                    .map_or("it did not finish".to_owned(), |c| format!(
                        "exit status {c}"
                    )),
                o.stderr.trim()
            )),
            Err(e) => {
                // The innermost cause says it: "execute PATH: Permission denied".
                let mut cause: &dyn std::error::Error = &e;
                while let Some(inner) = cause.source() {
                    cause = inner;
                }
                Err(format!(
                    "the {name} at {path} cannot start in a sandbox ({cause}); {fix}"
                ))
            }
        }
    }

    /// Runs a command line in a fresh shell.
    pub(crate) async fn command(
        &self,
        runtime: &Runtime,
        req: &CommandRequest,
        ctx: &ExecContext,
        settings: RunSettings,
    ) -> Result<ExecOutcome, Error> {
        if self.jail.has_ended() {
            return Err(Error::not_found(&self.id));
        }
        let bash_path = runtime.path_of(Language::Bash)?;
        bash::command(
            &self.jail,
            &bash_path,
            &self.env,
            req,
            ctx,
            &self.limits,
            settings.interrupt_grace,
        )
        .await
    }

    /// Installs packages with pip (into [`PYTHON_PACKAGES`], on `PYTHONPATH`) or npm (into
    /// `/workspace/node_modules`, where `require` looks first), through the egress proxy.
    /// Each package is one argument of the package manager, after `--`: never shell text,
    /// never an option.
    pub(crate) async fn install(
        &self,
        runtime: &Runtime,
        req: &InstallRequest,
        ctx: &ExecContext,
        settings: RunSettings,
    ) -> Result<ExecOutcome, Error> {
        if self.jail.has_ended() {
            return Err(Error::not_found(&self.id));
        }
        if self.egress.is_none() {
            return Err(Error::InvalidRequest(format!(
                "sandbox {} has no network access, so {} cannot download packages; create a \
                 sandbox with network: \"allowlist\" (the server's --allow-host list must \
                 include the package index)",
                self.id, req.manager
            )));
        }
        check_packages(&req.packages)?;
        let mut argv = match req.manager {
            PackageManager::Pip => {
                let python = runtime.path_of(Language::Python)?;
                [
                    python.as_str(),
                    "-m",
                    "pip",
                    "install",
                    "--target",
                    PYTHON_PACKAGES,
                    "--no-input",
                    "--disable-pip-version-check",
                    "--no-cache-dir",
                    "--progress-bar",
                    "off",
                    "--",
                ]
                .map(str::to_owned)
                .to_vec()
            }
            PackageManager::Npm => {
                let node = &runtime.require(Language::JavaScript)?.path;
                let cli = node
                    .parent()
                    .and_then(std::path::Path::parent)
                    .map(|prefix| prefix.join("lib/node_modules/npm/bin/npm-cli.js"))
                    .filter(|p| p.is_file())
                    .ok_or_else(|| Error::LanguageUnavailable {
                        language: Language::JavaScript,
                        reason: format!("npm is not installed beside {}", node.display()),
                    })?;
                [
                    node.to_string_lossy().as_ref(),
                    cli.to_string_lossy().as_ref(),
                    "install",
                    "--prefix",
                    "/workspace",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel",
                    "warn",
                    "--",
                ]
                .map(str::to_owned)
                .to_vec()
            }
        };
        argv.extend(req.packages.iter().cloned());
        let spawn = SpawnRequest {
            argv,
            env: self.env.clone(),
            cwd: "/workspace".into(),
        };
        bash::run_shell(
            &self.jail,
            spawn,
            false,
            req.timeout,
            ctx,
            &self.limits,
            settings.interrupt_grace,
        )
        .await
        .map(|(outcome, _)| outcome)
    }

    /// Starts a command line in the background.
    pub(crate) async fn start_process(
        &self,
        runtime: &Runtime,
        req: &CommandRequest,
    ) -> Result<runbox_core::ProcessInfo, Error> {
        if self.jail.has_ended() {
            return Err(Error::not_found(&self.id));
        }
        let bash_path = runtime.path_of(Language::Bash)?;
        self.processes
            .start(&self.jail, &bash_path, &self.env, req, self.limits.pids)
            .await
    }

    /// Runs code.
    pub(crate) async fn exec(
        &self,
        runtime: &Runtime,
        req: &ExecRequest,
        ctx: &ExecContext,
        settings: RunSettings,
    ) -> Result<ExecOutcome, Error> {
        if self.jail.has_ended() {
            return Err(Error::not_found(&self.id));
        }
        match req.language {
            Language::Bash => {
                let bash_path = runtime.path_of(Language::Bash)?;
                let mut state = self.bash.lock().await;
                bash::run(
                    &self.jail,
                    &bash_path,
                    &mut state,
                    req,
                    ctx,
                    &self.limits,
                    settings.interrupt_grace,
                )
                .await
            }
            language => {
                let transpiled;
                let req = match language {
                    Language::TypeScript => match transpile::typescript(&req.code) {
                        Ok(js) => {
                            transpiled = ExecRequest {
                                code: js,
                                ..req.clone()
                            };
                            &transpiled
                        }
                        Err(e) => return Ok(syntax_error_outcome(e)),
                    },
                    Language::JavaScript
                        if req.code.contains("import") || req.code.contains("export") =>
                    {
                        transpiled = ExecRequest {
                            code: transpile::javascript(&req.code),
                            ..req.clone()
                        };
                        &transpiled
                    }
                    _ => req,
                };
                let language = if language == Language::TypeScript {
                    Language::JavaScript
                } else {
                    language
                };
                let Some(slot) = self.slot(language) else {
                    return Err(Error::InvalidRequest(format!("{language} has no kernel")));
                };
                let mut slot = slot.lock().await;
                // A kernel that died since the last run (killed, out of memory) is found
                // now, so that this run, which gets a fresh one, says the state is gone.
                let mut lost_since = None;
                if let Some(k) = slot.kernel.as_mut()
                    && let Some(why) = k.lost_since_last_run(&self.jail).await
                {
                    // Whatever it left running in its process group goes with it.
                    k.kill(&self.jail).await;
                    slot.kernel = None;
                    slot.lost = false;
                    lost_since = Some(why);
                }
                let was_lost = slot.lost;
                let kernel = self
                    .live_kernel(&mut slot, runtime, language, settings)
                    .await?;
                let report = kernel
                    .run(&self.jail, req, ctx, &self.limits, settings.interrupt_grace)
                    .await;
                let mut outcome = report.outcome;
                if let Some(why) = lost_since {
                    outcome.kernel_restarted = true;
                    outcome.notes.insert(
                        0,
                        format!(
                            "The {language} kernel was lost after the previous run (it {why}); \
                             this run started a fresh one, so variables, imports and definitions \
                             from earlier runs are gone."
                        ),
                    );
                } else if was_lost {
                    slot.lost = false;
                    outcome.notes.insert(
                        0,
                        format!("A fresh {language} kernel was started: the previous one was lost, with its state."),
                    );
                }
                if !report.kernel_alive {
                    if let Some(mut k) = slot.kernel.take() {
                        k.kill(&self.jail).await;
                    }
                    slot.lost = true;
                }
                Ok(outcome)
            }
        }
    }
}
