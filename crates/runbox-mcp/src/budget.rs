//! The size of one message. Clients refuse messages past a limit of their own and some drop
//! the whole session when one arrives: the official Python SDK 2.x closes its streamable
//! HTTP session on any SSE event over 1 MiB. So every answer stays under the server's
//! message limit (`--message-limit`, 512 KiB by default, well under that 1 MiB):
//!
//! - `read_file` reads at most [`RunboxServer::read_budget`] bytes a call (`more` and
//!   `offset` page through the rest), and resources are read in pieces past
//!   [`RunboxServer::piece_budget`];
//! - a run's images travel once, as image content, with a reference (`{"uri", "size"}`) in
//!   `structuredContent` where their base64 was; an image or value too big for the message
//!   goes as a `resource_link` to an output the client reads in pieces
//!   ([`crate::outputs`]);
//! - `list_files` lists what fits, `read_process_output` returns what fits and keeps the
//!   rest for the next read, and a run's text shows the head and tail of streams whose two
//!   copies would not fit (`structuredContent` keeps all of them);
//! - an answer still over the limit (output past a raised `--output-limit`, a profile's
//!   JSON) is kept whole as an output and answered with a link to it
//!   ([`RunboxServer::fit_answer`]).

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Resource};

use crate::caller::Caller;
use crate::outputs::{Kept, OutputStore};
use crate::server::RunboxServer;

/// The default message limit: half of the 1 MiB the strictest known client accepts.
pub const DEFAULT_MESSAGE_LIMIT: usize = 512 << 10;
/// The smallest message limit `--message-limit` takes.
pub const MIN_MESSAGE_LIMIT: usize = 64 << 10;
/// The largest: rmcp's own clients refuse messages over 16 MiB.
pub const MAX_MESSAGE_LIMIT: usize = 16 << 20;

/// Room left in every message for what is not content: the JSON-RPC envelope, field names,
/// notes, resource links.
const OVERHEAD: usize = 16 << 10;

/// How many bytes `result` takes on the wire (as the JSON of its message, without the
/// envelope).
pub(crate) fn size_of(result: &CallToolResult) -> usize {
    serde_json::to_vec(result).map_or(usize::MAX, |v| v.len())
}

/// Where a rendering puts what it does not send inline: the output store, for the caller's
/// tenant, within the message limit.
pub(crate) struct Stash<'a> {
    pub store: &'a OutputStore,
    pub tenant: &'a str,
    pub limit: usize,
}

impl Stash<'_> {
    /// Keeps `data` as an output named `name`.
    pub(crate) fn put(&self, name: &str, mime: &str, data: Vec<u8>) -> Kept {
        self.store.put(self.tenant, name, mime, data)
    }

    /// The room for content in one message.
    pub(crate) fn room(&self) -> usize {
        self.limit.saturating_sub(OVERHEAD)
    }

    /// Most bytes of one piece of a resource (sent once, as base64).
    pub(crate) fn piece(&self) -> u64 {
        piece_of(self.limit)
    }
}

/// Most bytes of a piece: what fits in a message as base64, and never more than a file
/// read takes at once.
fn piece_of(limit: usize) -> u64 {
    ((limit.saturating_sub(OVERHEAD) / 4 * 3) as u64).min(crate::files::MAX_READ - 1)
}

/// The resource link to an output, and a line for the answer's text saying how to read it.
pub(crate) fn output_link(
    kept: &Kept,
    name: &str,
    mime: &str,
    what: &str,
    piece: u64,
) -> (ContentBlock, String) {
    let link = ContentBlock::resource_link(
        Resource::new(kept.uri.clone(), name.to_owned())
            .with_mime_type(mime.to_owned())
            .with_size(kept.size)
            .with_description(format!(
                "{what}; read it with resources/read, in pieces of at most {piece} bytes: \
                 {}?offset=0&length={piece}, then on from offset {piece}",
                kept.uri
            )),
    );
    let line = format!(
        "[{what} ({mime}, {} bytes) is too big for one message: it is the resource {}. Read it \
         with resources/read in pieces of at most {piece} bytes: {}?offset=0&length={piece}, \
         and on from offset {piece}.]",
        kept.size, kept.uri, kept.uri
    );
    (link, line)
}

impl RunboxServer {
    /// The most bytes one message may take.
    pub(crate) fn message_limit(&self) -> usize {
        self.settings().message_limit
    }

    /// The stash of a call by `caller`.
    pub(crate) fn stash<'a>(&'a self, caller: &'a Caller) -> Stash<'a> {
        Stash {
            store: self.outputs(),
            tenant: &caller.tenant,
            limit: self.message_limit(),
        }
    }

    /// Most bytes of a file one `read_file` returns: text travels twice in its answer (as
    /// text content and in `structuredContent`), so half the room.
    pub(crate) fn read_budget(&self) -> u64 {
        ((self.message_limit().saturating_sub(OVERHEAD) / 2) as u64).min(crate::files::MAX_READ)
    }

    /// Most bytes of one piece of a resource read, sent once as base64.
    pub(crate) fn piece_budget(&self) -> u64 {
        piece_of(self.message_limit())
    }

    /// The answer as sent: itself when it fits in one message; otherwise it is kept whole as
    /// an output (its JSON) and the answer says where, with a link to read it in pieces.
    /// Such an answer is an error result, since the one asked for could not be sent.
    pub(crate) fn fit_answer(
        &self,
        caller: &Caller,
        tool: &str,
        answer: Result<CallToolResponse, ErrorData>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Ok(CallToolResponse::Complete(result)) = answer else {
            return answer;
        };
        let size = size_of(&result);
        if size <= self.message_limit().saturating_sub(OVERHEAD / 4) {
            return Ok(CallToolResponse::Complete(result));
        }
        let json = serde_json::to_vec_pretty(&result).unwrap_or_default();
        let stash = self.stash(caller);
        let name = format!("{tool}-answer.json");
        let kept = stash.put(&name, "application/json", json);
        let (link, line) = output_link(
            &kept,
            &name,
            "application/json",
            &format!("The answer of {tool}"),
            stash.piece(),
        );
        let text = format!(
            "The answer of {tool} takes {size} bytes, more than the {} bytes one message may \
             carry (clients drop bigger ones). It is kept whole as JSON, the MCP result with its \
             content and structuredContent. {}",
            self.message_limit(),
            line.trim_start_matches('[').trim_end_matches(']')
        );
        let mut fitted = CallToolResult::error(vec![ContentBlock::text(text), link]);
        fitted.meta = result.meta;
        Ok(CallToolResponse::Complete(fitted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fit_in_a_message_as_base64() {
        let piece = piece_of(DEFAULT_MESSAGE_LIMIT);
        let b64 = piece.div_ceil(3) * 4;
        assert!(b64 as usize + OVERHEAD <= DEFAULT_MESSAGE_LIMIT, "{piece}");
        assert!(
            piece > 256 << 10,
            "pieces are not needlessly small: {piece}"
        );
    }
}
