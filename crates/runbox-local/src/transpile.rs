//! TypeScript, and ES module syntax, for the JavaScript kernel: transpiled in the server with
//! oxc (no npm, no network, nothing run in the sandbox for it).
//!
//! The kernel runs each piece of code as a script in one persistent context, so:
//!
//! - TypeScript is type-stripped (types never block a run: nothing is type-checked); every
//!   value import is kept, even one a cell does not use yet, because a later cell may;
//! - top-level `import` becomes `var x = require(...)` (re-runnable, unlike `const`), and
//!   `export` is dropped from declarations, so module-style code runs as a cell.
//!
//! A syntax error comes back with its line and column in the code the caller wrote.

use oxc_allocator::Allocator;
use oxc_ast::ast::{
    ExportDefaultDeclarationKind, ImportDeclarationSpecifier, ModuleExportName, Statement,
};
use oxc_codegen::Codegen;
use oxc_parser::Parser;
use oxc_semantic::SemanticBuilder;
use oxc_span::{GetSpan, SourceType};
use oxc_transformer::{TransformOptions, Transformer};

/// Code that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    /// What is wrong.
    pub(crate) message: String,
    /// 1-based line of the error in the caller's code.
    pub(crate) line: usize,
    /// 1-based column.
    pub(crate) column: usize,
    /// The message with the offending lines quoted.
    pub(crate) rendered: String,
}

fn line_column(code: &str, offset: usize) -> (usize, usize) {
    let before = &code[..offset.min(code.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn syntax_error(code: &str, diagnostics: &oxc_diagnostics::Diagnostics) -> SyntaxError {
    let first = diagnostics.errors().next().cloned();
    let (message, offset) = match &first {
        Some(d) => (
            d.message.to_string(),
            d.labels.first().map_or(0, |l| l.offset() as usize),
        ),
        None => ("invalid syntax".to_owned(), 0),
    };
    let (line, column) = line_column(code, offset);
    let rendered = first
        .map(|d| d.render_with_source_code(code.to_owned()))
        .unwrap_or_else(|| message.clone());
    SyntaxError {
        message,
        line,
        column,
        rendered,
    }
}

/// TypeScript to a script the JavaScript kernel can run. The caller's code drives the
/// transpiler, so a panic inside it is contained and reported as an error of the code.
pub(crate) fn typescript(code: &str) -> Result<String, SyntaxError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transpile_typescript(code))) {
        Ok(r) => r,
        Err(_) => Err(SyntaxError {
            message: "the TypeScript transpiler could not handle this code".into(),
            line: 1,
            column: 1,
            rendered: "the TypeScript transpiler failed on this code; try plain JavaScript".into(),
        }),
    }
}

fn transpile_typescript(code: &str) -> Result<String, SyntaxError> {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, code, SourceType::ts()).parse();
    if parsed.diagnostics.has_errors() || parsed.panicked {
        return Err(syntax_error(code, &parsed.diagnostics));
    }
    let mut program = parsed.program;
    let scoping = SemanticBuilder::new()
        .with_enum_eval(true)
        .build(&program)
        .semantic
        .into_scoping();
    let mut options = TransformOptions::default();
    // A cell's import may be used only by a later cell: never drop one as unused.
    options.typescript.only_remove_type_imports = true;
    let transformed = Transformer::new(&allocator, std::path::Path::new("cell.ts"), &options)
        .build_with_scoping(scoping, &mut program);
    if transformed.diagnostics.has_errors() {
        return Err(syntax_error(code, &transformed.diagnostics));
    }
    let js = Codegen::new().build(&program).code;
    Ok(modules_to_script(&js))
}

/// JavaScript with top-level `import`/`export` rewritten for the script context; other code
/// (and code that does not parse, which the kernel then reports) is returned unchanged.
pub(crate) fn javascript(code: &str) -> String {
    if !(code.contains("import") || code.contains("export")) {
        return code.to_owned();
    }
    modules_to_script(code)
}

/// Rewrites top-level ES module syntax into script equivalents, editing only those
/// statements so everything else (and its line numbers) stays as written.
fn modules_to_script(code: &str) -> String {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rewrite_modules(code)))
        .unwrap_or_else(|_| code.to_owned())
}

fn rewrite_modules(code: &str) -> String {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, code, SourceType::mjs()).parse();
    if parsed.diagnostics.has_errors() || parsed.panicked {
        return code.to_owned();
    }
    let mut edits: Vec<(u32, u32, String)> = Vec::new();
    for stmt in &parsed.program.body {
        match stmt {
            Statement::ImportDeclaration(decl) => {
                let source = serde_json::to_string(decl.source.value.as_str()).unwrap_or_default();
                let module = format!("require({source})");
                let mut out = Vec::new();
                let mut named = Vec::new();
                match &decl.specifiers {
                    None => out.push(format!("{module};")),
                    Some(specifiers) => {
                        for s in specifiers {
                            match s {
                                ImportDeclarationSpecifier::ImportDefaultSpecifier(d) => out.push(format!(
                                    "var {} = ((m) => (m && m.__esModule ? m.default : m))({module});",
                                    d.local.name
                                )),
                                ImportDeclarationSpecifier::ImportNamespaceSpecifier(n) => {
                                    out.push(format!("var {} = {module};", n.local.name));
                                }
                                ImportDeclarationSpecifier::ImportSpecifier(s) => {
                                    let imported = match &s.imported {
                                        ModuleExportName::IdentifierName(i) => i.name.to_string(),
                                        ModuleExportName::IdentifierReference(i) => i.name.to_string(),
                                        ModuleExportName::StringLiteral(l) => {
                                            serde_json::to_string(l.value.as_str()).unwrap_or_default()
                                        }
                                    };
                                    named.push(format!("{imported}: {}", s.local.name));
                                }
                            }
                        }
                    }
                }
                if !named.is_empty() {
                    out.push(format!("var {{ {} }} = {module};", named.join(", ")));
                }
                edits.push((decl.span.start, decl.span.end, out.join(" ")));
            }
            // `export const x = 1` → `const x = 1`
            Statement::ExportDeclaration(decl) => {
                edits.push((
                    decl.span.start,
                    decl.declaration.span().start,
                    String::new(),
                ));
            }
            // `export { a, b }` and re-exports export nothing a cell can use.
            Statement::ExportNamedDeclaration(decl) => {
                edits.push((decl.span.start, decl.span.end, String::new()))
            }
            Statement::ExportFromDeclaration(decl) => {
                edits.push((decl.span.start, decl.span.end, String::new()))
            }
            Statement::ExportDefaultDeclaration(decl) => {
                let inner = match &decl.declaration {
                    ExportDefaultDeclarationKind::FunctionDeclaration(f) => f.span.start,
                    ExportDefaultDeclarationKind::ClassDeclaration(c) => c.span.start,
                    other => other.span().start,
                };
                edits.push((decl.span.start, inner, String::new()));
            }
            Statement::ExportAllDeclaration(decl) => {
                edits.push((decl.span.start, decl.span.end, String::new()))
            }
            _ => {}
        }
    }
    let mut out = code.to_owned();
    for (start, end, text) in edits.into_iter().rev() {
        out.replace_range(start as usize..end as usize, &text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_stripped_and_values_kept() {
        let js = typescript(
            "interface P { x: number }\nconst p: P = { x: 1 };\nfunction f(a: number): string { return String(a) }\nf(p.x)",
        )
        .unwrap();
        assert!(
            !js.contains("interface") && !js.contains(": number"),
            "{js}"
        );
        assert!(js.contains("f(p.x)"), "{js}");
    }

    #[test]
    fn imports_become_require_and_are_kept_even_unused() {
        let js = typescript(
            "import fs from 'fs';\nimport * as path from 'node:path';\nimport { join as j, sep } from 'path';\nimport type { Stats } from 'fs';\nimport 'util';",
        )
        .unwrap();
        assert!(
            js.contains(r#"var fs = ((m) => (m && m.__esModule ? m.default : m))(require("fs"));"#),
            "{js}"
        );
        assert!(js.contains(r#"var path = require("node:path");"#), "{js}");
        assert!(
            js.contains(r#"var { join: j, sep: sep } = require("path");"#),
            "{js}"
        );
        assert!(js.contains(r#"require("util");"#), "{js}");
        assert!(!js.contains("Stats"), "type imports go: {js}");
    }

    #[test]
    fn exports_are_dropped_from_declarations() {
        let out = javascript(
            "export const a = 1;\nexport function g() { return a }\nexport default g;\nexport { g as h };\ng()",
        );
        assert!(!out.contains("export"), "{out}");
        assert!(
            out.contains("const a = 1;") && out.contains("function g()"),
            "{out}"
        );
        assert!(out.ends_with("g()"), "{out}");
    }

    #[test]
    fn plain_javascript_is_left_alone() {
        let code = "const x = 1;\n// a comment\nx + 1";
        assert_eq!(javascript(code), code);
        // Not parseable here: left for the kernel to report.
        assert_eq!(javascript("import ("), "import (");
    }

    #[test]
    fn syntax_errors_name_the_line_and_column() {
        let e = typescript("const ok = 1;\nlet x: number = ;\n").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        assert!(e.column > 1);
        assert!(!e.message.is_empty());
        assert!(e.rendered.contains("let x"), "{}", e.rendered);
    }

    #[test]
    fn enums_are_transpiled() {
        let js = typescript("enum Color { Red, Green = 5, Blue }\nColor.Blue").unwrap();
        assert!(!js.contains("enum "), "{js}");
        assert!(js.contains("Color"), "{js}");
    }

    #[test]
    fn top_level_await_survives() {
        let js = typescript("const v: number = await Promise.resolve(1);\nv").unwrap();
        assert!(js.contains("await Promise.resolve(1)"), "{js}");
    }
}
