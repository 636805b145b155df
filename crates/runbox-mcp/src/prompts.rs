//! Prompts: `sandbox_instructions`, how to use runbox's tools well.

use std::fmt::Write as _;

use rmcp::model::{GetPromptResult, PromptMessage, Role};
use rmcp::{prompt, prompt_router};

use crate::server::RunboxServer;

/// The body of `sandbox_instructions`, before the server-specific part.
const INSTRUCTIONS: &str = "\
You can run code in isolated sandboxes with these tools.

1. For a quick, self-contained snippet, call run_code with just `code` (and `language`: \
python, javascript, typescript or bash). It runs in a fresh sandbox that is closed afterwards.
2. For work in several steps (load data, then analyse it, then plot), call create_sandbox once \
and pass its sandbox_id to every later call. Variables, imports and functions persist in each \
language's kernel, and files persist in /workspace, so do not repeat earlier steps: build on \
them. TypeScript and JavaScript share one context.
3. The value of the last expression of a Python or JavaScript cell is returned, as in a \
notebook; print what else you need. matplotlib figures, pandas DataFrames and objects with \
_repr_png_/_repr_html_ come back as images and HTML; call display(obj) to show several.
4. Use run_command for shell tools (ls, pip list, git, python script.py); each call is a fresh \
shell in /workspace. For a long job or a server, pass background: true and follow it with \
read_process_output (wait_seconds waits for new output); stop it with kill_process.
5. Move files with write_file (utf-8 text, or base64 for binary) and read_file (text comes back \
as text, images as images, big files in parts with offset and length); list_files shows what \
is there. Paths are in /workspace (relative paths start there) or /tmp. Files a run creates or \
changes in /workspace are linked in its answer as sandbox://{sandbox_id}/files/... resources.
6. A failed run says why: the error's name, message and traceback, or the exit code. Fix the \
code and run again in the same sandbox; a timeout interrupts the code but keeps the kernel's \
state.
7. Sandboxes have limited memory, processes and disk; the answers of create_sandbox and \
get_sandbox_status give the limits. They have no network access, unless created with network \
\"allowlist\": then they reach the hosts the server allows (package indexes by default) and \
install_packages installs pip or npm packages, importable at once.
8. Close a sandbox with close_sandbox when the task is done. Idle sandboxes expire on their \
own (900 seconds by default; set_sandbox_timeout changes it); pause_sandbox keeps one, frozen, \
until resume_sandbox.";

#[prompt_router(router = "prompt_router", vis = "pub(crate)")]
impl RunboxServer {
    #[prompt(
        name = "sandbox_instructions",
        description = "How to use runbox's sandboxes well: when to create one, how state, files and \
                       rich output work, and when to close it."
    )]
    async fn sandbox_instructions(&self) -> GetPromptResult {
        let mut text = INSTRUCTIONS.to_owned();
        if let Some(data) = self.data_catalog() {
            let files = data.files();
            let _ = write!(
                text,
                "\n9. The operator's data files are in /data (read-only) in every sandbox"
            );
            if files.is_empty() {
                text.push_str("; it is empty now.");
            } else {
                text.push_str(":\n");
                for f in files.iter().take(50) {
                    let _ = writeln!(text, "   - /data/{} ({} bytes)", f.relative, f.size);
                }
                if files.len() > 50 {
                    let _ = writeln!(text, "   - and {} more", files.len() - 50);
                }
            }
        }
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description("How to use runbox's sandboxes well")
    }
}
