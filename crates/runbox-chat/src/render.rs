//! What the terminal shows: the model's text as it streams, each tool call with its code
//! highlighted, each result (images saved to files), notices. Interactive, everything goes
//! to stdout; with `--prompt`, stdout gets the final answer only and the rest goes to
//! stderr. Colour only on a terminal and without `NO_COLOR`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::mcp::{Image, ToolOutcome};
use crate::model::shorten;

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const BLUE: &str = "\x1b[34m";
const MAGENTA: &str = "\x1b[35m";
const CYAN: &str = "\x1b[36m";
const GREY: &str = "\x1b[90m";

/// Lines of a result shown (the model always gets all of it).
const RESULT_LINES: usize = 30;

#[derive(Debug)]
pub(crate) struct Renderer {
    /// `--prompt`: traces on stderr, the answer alone on stdout.
    one_shot: bool,
    /// Colour on the stream traces go to.
    color: bool,
    images_dir: PathBuf,
    images_saved: usize,
}

fn wants_color(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

impl Renderer {
    pub(crate) fn new(one_shot: bool, images_dir: PathBuf) -> Self {
        let is_terminal = if one_shot {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        Self {
            one_shot,
            color: wants_color(is_terminal),
            images_dir,
            images_saved: 0,
        }
    }

    fn paint(&self, color: &str, text: &str) -> String {
        if self.color {
            format!("{color}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    /// Writes to the trace stream (stdout, or stderr with `--prompt`).
    fn trace(&self, text: &str) {
        if self.one_shot {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(text.as_bytes());
            let _ = err.flush();
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }

    pub(crate) fn prompt(&self) {
        self.trace(&format!(
            "\n{} ",
            self.paint(&format!("{BOLD}{YELLOW}"), "you>")
        ));
    }

    pub(crate) fn banner(&self, text: &str) {
        self.trace(&format!("{}\n", self.paint(GREY, text)));
    }

    /// A piece of the model's text, as it arrives (interactive only: with `--prompt`,
    /// text is shown once it is known whether it is the answer).
    pub(crate) fn text_delta(&self, text: &str) {
        if !self.one_shot {
            self.trace(text);
        }
    }

    /// The end of one model response.
    pub(crate) fn response_done(&self, content: &str, asks_for_tools: bool) {
        if content.is_empty() {
            return;
        }
        if !self.one_shot {
            self.trace("\n");
        } else if asks_for_tools {
            self.trace(&format!("{}\n", content.trim_end()));
        }
    }

    /// The final answer of a `--prompt` run, on stdout.
    pub(crate) fn final_answer(&self, content: &str) {
        if self.one_shot {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", content.trim_end());
            let _ = out.flush();
        }
    }

    pub(crate) fn notice(&self, text: &str) {
        self.trace(&format!("{}\n", self.paint(YELLOW, text)));
    }

    pub(crate) fn tool_call(&self, name: &str, args: &Map<String, Value>) {
        let code = ["code", "python_code", "command", "command_line"]
            .iter()
            .find_map(|k| Some((*k, args.get(*k)?.as_str()?)));
        let language = match code {
            Some(("command" | "command_line", _)) => "bash",
            _ => args
                .get("language")
                .and_then(Value::as_str)
                .unwrap_or("python"),
        };
        let rest: Vec<String> = args
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != code.map(|c| c.0) && k.as_str() != "language")
            .map(|(k, v)| format!("{k}={}", shorten(&v.to_string(), 80)))
            .collect();
        let mut out = format!("{} {}", self.paint(CYAN, "●"), self.paint(BOLD, name));
        if code.is_some() && !matches!(name, "run_command" | "run_on_command_line") {
            out.push_str(&self.paint(GREY, &format!(" ({language})")));
        }
        if !rest.is_empty() {
            out.push(' ');
            out.push_str(&self.paint(GREY, &rest.join(" ")));
        }
        out.push('\n');
        if let Some((_, code)) = code {
            let shown = if self.color {
                highlight(code, language)
            } else {
                code.to_owned()
            };
            for line in shown.lines() {
                out.push_str(&format!("  {} {line}\n", self.paint(GREY, "│")));
            }
        }
        self.trace(&out);
    }

    /// Arguments the model wrote that are not a JSON object.
    pub(crate) fn bad_arguments(&self, name: &str, raw: &str, problem: &str) {
        self.trace(&format!(
            "{} {} {}\n  {}\n",
            self.paint(CYAN, "●"),
            self.paint(BOLD, name),
            self.paint(GREY, &shorten(raw, 200)),
            self.paint(RED, problem)
        ));
    }

    /// Saves the images of a result; returns each one's path (or why it could not be
    /// saved).
    pub(crate) fn save_images(&mut self, images: &[Image]) -> Vec<Result<PathBuf, String>> {
        images
            .iter()
            .map(|image| {
                std::fs::create_dir_all(&self.images_dir)
                    .map_err(|e| format!("cannot create {}: {e}", self.images_dir.display()))?;
                self.images_saved += 1;
                let ext = match image.mime_type.as_str() {
                    "image/jpeg" => "jpg",
                    "image/gif" => "gif",
                    "image/webp" => "webp",
                    "image/svg+xml" => "svg",
                    _ => "png",
                };
                let path = self
                    .images_dir
                    .join(format!("image-{}.{ext}", self.images_saved));
                std::fs::write(&path, &image.data)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                Ok(path)
            })
            .collect()
    }

    pub(crate) fn tool_result(&self, outcome: &ToolOutcome, images: &[Result<PathBuf, String>]) {
        let color = if outcome.is_error { RED } else { "" };
        let mut lines: Vec<&str> = outcome.text.trim_end().lines().collect();
        let hidden = lines.len().saturating_sub(RESULT_LINES);
        lines.truncate(RESULT_LINES);
        let mut out = String::new();
        let mut first = true;
        let mut line_out = |text: String| {
            let lead = if first { "⎿" } else { " " };
            first = false;
            out.push_str(&format!("  {} {text}\n", self.paint(GREY, lead)));
        };
        if lines.is_empty() && images.is_empty() {
            line_out(self.paint(GREY, "(no output)"));
        }
        for line in lines {
            let line = shorten(line, 300);
            line_out(if color.is_empty() {
                line
            } else {
                self.paint(color, &line)
            });
        }
        if hidden > 0 {
            line_out(self.paint(GREY, &format!("… {hidden} more lines")));
        }
        for image in images {
            line_out(match image {
                Ok(path) => self.paint(GREEN, &format!("image saved: {}", path.display())),
                Err(e) => self.paint(RED, &format!("image not saved: {e}")),
            });
        }
        self.trace(&out);
    }

    pub(crate) fn tool_failure(&self, message: &str) {
        self.trace(&format!(
            "  {} {}\n",
            self.paint(GREY, "⎿"),
            self.paint(RED, message)
        ));
    }
}

/// A language's keywords, comment start, and whether `/* */` comments exist.
fn syntax(language: &str) -> (&'static [&'static str], &'static str, bool) {
    const PYTHON: &[&str] = &[
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
        "try", "while", "with", "yield", "print",
    ];
    const JS: &[&str] = &[
        "async",
        "await",
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "default",
        "delete",
        "do",
        "else",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "import",
        "in",
        "instanceof",
        "interface",
        "let",
        "new",
        "null",
        "of",
        "return",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "type",
        "typeof",
        "undefined",
        "var",
        "void",
        "while",
        "yield",
        "from",
    ];
    const BASH: &[&str] = &[
        "case", "cd", "do", "done", "echo", "elif", "else", "esac", "export", "fi", "for",
        "function", "if", "in", "local", "return", "then", "until", "while",
    ];
    match language {
        "javascript" | "typescript" | "js" | "ts" | "node" => (JS, "//", true),
        "bash" | "sh" | "shell" => (BASH, "#", false),
        _ => (PYTHON, "#", false),
    }
}

/// Colours keywords, strings, comments and numbers of python, javascript/typescript or
/// bash code with ANSI escapes. Small and forgiving: it never changes the text itself.
pub(crate) fn highlight(code: &str, language: &str) -> String {
    let (keywords, line_comment, block_comments) = syntax(language);
    let quotes: &[char] = if block_comments {
        &['"', '\'', '`']
    } else {
        &['"', '\'']
    };
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len() * 2);
    let mut i = 0;
    let starts = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    let span = |out: &mut String, color: &str, from: usize, to: usize| {
        out.push_str(color);
        out.extend(&chars[from..to]);
        out.push_str(RESET);
    };
    while i < chars.len() {
        let c = chars[i];
        if starts(i, line_comment) && (line_comment != "#" || i == 0 || !is_word(chars[i - 1])) {
            let end = chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p);
            span(&mut out, GREY, i, end);
            i = end;
        } else if block_comments && starts(i, "/*") {
            let end = (i + 2..chars.len())
                .find(|&j| starts(j, "*/"))
                .map_or(chars.len(), |j| j + 2);
            span(&mut out, GREY, i, end);
            i = end;
        } else if quotes.contains(&c) {
            let triple: String = [c, c, c].iter().collect();
            let (open, close) = if language_is_python(language) && starts(i, &triple) {
                (3, triple)
            } else {
                (1, c.to_string())
            };
            let mut j = i + open;
            while j < chars.len() && !starts(j, &close) {
                if chars[j] == '\\' {
                    j += 1;
                } else if open == 1 && c != '`' && chars[j] == '\n' {
                    break;
                }
                j += 1;
            }
            let end = (j + close.chars().count()).min(chars.len());
            span(&mut out, GREEN, i, end);
            i = end;
        } else if c.is_ascii_digit() && (i == 0 || !is_word(chars[i - 1])) {
            let end = (i..chars.len())
                .find(|&j| {
                    !(chars[j].is_ascii_alphanumeric() || chars[j] == '.' || chars[j] == '_')
                })
                .unwrap_or(chars.len());
            span(&mut out, CYAN, i, end);
            i = end;
        } else if is_word(c) {
            let end = (i..chars.len())
                .find(|&j| !is_word(chars[j]))
                .unwrap_or(chars.len());
            let word: String = chars[i..end].iter().collect();
            if keywords.contains(&word.as_str()) {
                span(&mut out, &format!("{BOLD}{MAGENTA}"), i, end);
            } else if end < chars.len() && chars[end] == '(' {
                span(&mut out, BLUE, i, end);
            } else {
                out.push_str(&word);
            }
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn language_is_python(language: &str) -> bool {
    !matches!(
        language,
        "javascript" | "typescript" | "js" | "ts" | "node" | "bash" | "sh" | "shell"
    )
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> String {
        let mut out = String::new();
        let mut escape = false;
        for c in s.chars() {
            match (escape, c) {
                (false, '\x1b') => escape = true,
                (true, 'm') => escape = false,
                (true, _) => {}
                (false, c) => out.push(c),
            }
        }
        out
    }

    #[test]
    fn highlighting_colours_tokens_and_keeps_the_text() {
        let py = "import math  # the module\ns = 'it''s'\nx = \"\"\"a\n'b'\"\"\"\ndef f(n):\n    return n * 2.5";
        let h = highlight(py, "python");
        assert_eq!(strip(&h), py);
        assert!(
            h.contains(&format!("{BOLD}{MAGENTA}import{RESET}")),
            "{h:?}"
        );
        assert!(h.contains(&format!("{GREY}# the module{RESET}")), "{h:?}");
        assert!(h.contains(&format!("{GREEN}'it'{RESET}")), "{h:?}");
        assert!(
            h.contains(&format!("{GREEN}\"\"\"a\n'b'\"\"\"{RESET}")),
            "{h:?}"
        );
        assert!(h.contains(&format!("{CYAN}2.5{RESET}")), "{h:?}");

        let js = "const s = `a ${b}`; // done\n/* block */ let n = 42;";
        let h = highlight(js, "javascript");
        assert_eq!(strip(&h), js);
        assert!(h.contains(&format!("{GREEN}`a ${{b}}`{RESET}")), "{h:?}");
        assert!(h.contains(&format!("{GREY}/* block */{RESET}")), "{h:?}");
        assert!(h.contains(&format!("{BOLD}{MAGENTA}const{RESET}")), "{h:?}");

        let sh = "echo \"$HOME\" # home\nls x#y";
        let h = highlight(sh, "bash");
        assert_eq!(strip(&h), sh);
        assert!(h.contains(&format!("{GREY}# home{RESET}")), "{h:?}");
        assert!(!h.contains(&format!("{GREY}#y")), "{h:?}");
        // Unterminated strings and odd input end cleanly.
        for odd in ["'open", "\"\"\"", "x = '\\", "/*", "`"] {
            assert_eq!(strip(&highlight(odd, "javascript")), odd);
            assert_eq!(strip(&highlight(odd, "python")), odd);
        }
    }
}
