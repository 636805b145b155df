//! Completions (`completion/complete`) for the resource template
//! `sandbox://{sandbox_id}/files/{path}`: `sandbox_id` completes to the caller's own
//! sandboxes, `path` (given `sandbox_id` in the context) to the entries of the folder typed
//! so far, as the template writes them (no leading slash, folders ending in `/`). Prompt
//! arguments are free text: a prompt's argument gets no suggestions; an unknown prompt,
//! template or argument is an invalid-params error.
//!
//! A sandbox the caller does not own completes to nothing, exactly like one that does not
//! exist: completions never tell one tenant of another's sandboxes.

use percent_encoding::percent_decode_str;
use rmcp::ErrorData;
use rmcp::model::{CompleteRequestParams, CompleteResult, CompletionInfo, Prompt, Reference};
use runbox_core::{FileKind, Registry, SandboxId};

use crate::resources::SANDBOX_FILE_TEMPLATE;

/// The areas of a sandbox the file tools reach, as the template's `path` starts.
const AREAS: [&str; 3] = ["workspace/", "tmp/", "data/"];

/// Answers `completion/complete` for `tenant`.
pub(crate) async fn complete(
    registry: &Registry,
    tenant: &str,
    has_data: bool,
    prompts: &[Prompt],
    request: &CompleteRequestParams,
) -> Result<CompleteResult, ErrorData> {
    let argument = &request.argument;
    let values = match &request.r#ref {
        Reference::Resource(r) if r.uri == SANDBOX_FILE_TEMPLATE => match argument.name.as_str() {
            "sandbox_id" => registry
                .list(tenant)
                .into_iter()
                .map(|s| s.id.to_string())
                .filter(|id| id.starts_with(&argument.value))
                .collect(),
            "path" => {
                let sandbox = request
                    .context
                    .as_ref()
                    .and_then(|c| c.arguments.as_ref())
                    .and_then(|a| a.get("sandbox_id"));
                match sandbox {
                    Some(id) => {
                        paths(
                            registry,
                            tenant,
                            &SandboxId::from(id.as_str()),
                            has_data,
                            &argument.value,
                        )
                        .await
                    }
                    // Which sandbox is not known yet: nothing to suggest.
                    None => Vec::new(),
                }
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "the template {SANDBOX_FILE_TEMPLATE} has no argument {other:?}; complete \
                         sandbox_id or path"
                    ),
                    None,
                ));
            }
        },
        Reference::Resource(r) => {
            return Err(ErrorData::invalid_params(
                format!(
                    "no resource template {:?} here; the only one is {SANDBOX_FILE_TEMPLATE}",
                    r.uri
                ),
                None,
            ));
        }
        Reference::Prompt(p) => {
            let Some(prompt) = prompts.iter().find(|x| x.name == p.name) else {
                return Err(ErrorData::invalid_params(
                    format!("no prompt {:?} here (prompts/list shows them)", p.name),
                    None,
                ));
            };
            let known = prompt
                .arguments
                .iter()
                .flatten()
                .any(|a| a.name == argument.name);
            if !known {
                return Err(ErrorData::invalid_params(
                    format!(
                        "the prompt {:?} has no argument {:?}",
                        p.name, argument.name
                    ),
                    None,
                ));
            }
            Vec::new()
        }
        _ => {
            return Err(ErrorData::invalid_params(
                "completions are for ref/resource and ref/prompt",
                None,
            ));
        }
    };
    Ok(CompleteResult::new(info(values)))
}

/// At most [`CompletionInfo::MAX_VALUES`] values, with the total and whether more exist.
fn info(mut values: Vec<String>) -> CompletionInfo {
    let total = values.len();
    values.truncate(CompletionInfo::MAX_VALUES);
    let more = total > CompletionInfo::MAX_VALUES;
    let total = Some(u32::try_from(total).unwrap_or(u32::MAX));
    // Within MAX_VALUES by now, so never refused.
    CompletionInfo::with_pagination(values, total, more).unwrap_or_default()
}

/// Completions of a template `path` typed so far (`workspace/da`): the areas while no
/// folder is typed, else the entries of the folder that start with the rest.
async fn paths(
    registry: &Registry,
    tenant: &str,
    sandbox: &SandboxId,
    has_data: bool,
    typed: &str,
) -> Vec<String> {
    // Owned, or nothing: another tenant's sandbox is as unknown as a missing one.
    if registry.describe(tenant, sandbox).is_err() {
        return Vec::new();
    }
    let typed = percent_decode_str(typed).decode_utf8_lossy();
    let typed = typed.trim_start_matches('/');
    let Some((folder, start)) = typed.rsplit_once('/') else {
        return AREAS
            .iter()
            .filter(|a| has_data || **a != "data/")
            .filter(|a| a.starts_with(typed))
            .map(|a| (*a).to_owned())
            .collect();
    };
    let Ok(listing) = registry
        .list_files(tenant, sandbox, &format!("/{folder}"), false)
        .await
    else {
        return Vec::new();
    };
    listing
        .entries
        .iter()
        .filter(|e| e.name.starts_with(start))
        .map(|e| {
            let slash = if e.kind == FileKind::Directory {
                "/"
            } else {
                ""
            };
            format!("{folder}/{}{slash}", e.name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_capped_with_the_total() {
        let i = info((0..150).map(|n| n.to_string()).collect());
        assert_eq!(i.values.len(), CompletionInfo::MAX_VALUES);
        assert_eq!(i.total, Some(150));
        assert_eq!(i.has_more, Some(true));
        let i = info(vec!["a".into()]);
        assert_eq!((i.total, i.has_more), (Some(1), Some(false)));
    }
}
