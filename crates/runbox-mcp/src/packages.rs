//! `install_packages`: pip or npm packages into a sandbox with network access.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use runbox_core::{InstallRequest, PackageManager, SandboxId};

use crate::render;
use crate::server::{RunboxServer, seconds};
use crate::types::{InstallPackagesArgs, InstallPackagesOutput, ManagerArg};

/// An install's timeout when the caller gives none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

#[tool_router(router = package_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        description = "Install Python packages with pip (importable at once in run_code and by \
                       python3) or Node packages with npm (into /workspace/node_modules) in a \
                       sandbox created with network \"allowlist\". Each package is a name, \
                       optionally with a version (requests==2.32, lodash@4); returns the package \
                       manager's log and exit code.",
        output_schema = schema_for_output::<InstallPackagesOutput>(),
        annotations(title = "Install packages", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn install_packages(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<InstallPackagesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let timeout = match args.timeout_seconds {
            None => DEFAULT_TIMEOUT.min(self.settings().max_run_timeout),
            Some(t) => match seconds(t, "timeout_seconds") {
                Ok(t) if t <= self.settings().max_run_timeout => t,
                Ok(_) => {
                    return render::error(&runbox_core::Error::InvalidRequest(format!(
                        "timeout_seconds {t} exceeds this server's maximum of {} s",
                        self.settings().max_run_timeout.as_secs()
                    )));
                }
                Err(e) => return render::error(&e),
            },
        };
        let manager = match args.manager {
            ManagerArg::Pip => PackageManager::Pip,
            ManagerArg::Npm => PackageManager::Npm,
        };
        let id = SandboxId::from(args.sandbox_id);
        let req = InstallRequest {
            manager,
            packages: args.packages.clone(),
            timeout,
        };
        let exec_ctx = runbox_core::ExecContext {
            cancel: ctx.ct.clone(),
            ..Default::default()
        };
        match self
            .registry()
            .install(&caller.tenant, &id, req, exec_ctx)
            .await
        {
            Ok(o) => {
                let out = InstallPackagesOutput {
                    sandbox_id: id.to_string(),
                    manager: args.manager,
                    packages: args.packages,
                    exit_code: i64::from(o.exit_code.unwrap_or(-1)),
                    stdout: o.stdout,
                    stderr: o.stderr,
                    duration_ms: i64::try_from(o.duration.as_millis()).unwrap_or(i64::MAX),
                    timed_out: o.timed_out,
                };
                let mut text = String::new();
                render::section(&mut text, "stdout", &out.stdout);
                render::section(&mut text, "stderr", &out.stderr);
                let ok = out.exit_code == 0 && !out.timed_out;
                text.push_str(&if ok {
                    format!("[installed with {manager}: {}]\n", out.packages.join(" "))
                } else if out.timed_out {
                    format!("[{manager} was stopped after {} s]\n", timeout.as_secs())
                } else {
                    format!("[{manager} failed with exit code {}]\n", out.exit_code)
                });
                let mut result = render::ok(text, &out);
                result.is_error = Some(!ok);
                result
            }
            Err(e) => render::error(&e),
        }
    }
}
