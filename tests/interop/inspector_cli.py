"""runbox through MCP Inspector's CLI (`mcp-inspector --cli`), which sends each
`--tool-arg key=value` as the text typed, converted only where the tool's schema says a
number, a boolean, an object or an array: a language comes as typed (`language=Python`,
`language=js`).

Usage:
    inspector_cli.py INSPECTOR URL

INSPECTOR is the mcp-inspector executable; URL a running `runbox serve --http` (default
tools). Checks that the schemas stay exact (canonical language names), that languages are
taken in any case and by alias, and a flow of typed arguments (numbers, a JSON map, a
boolean) through the CLI. Exits 0 when every check holds, 1 with the failed check otherwise.
"""

import json
import subprocess
import sys


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def inspector(exe, url, *args):
    """One CLI call; its JSON output, or its error text."""
    cmd = [exe, "--cli", url, "--transport", "http", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = p.stdout[p.stdout.find("{"):] if "{" in p.stdout else p.stdout
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return {"cli_error": p.stdout + p.stderr}


def call(exe, url, tool, **args):
    flags = ["--method", "tools/call", "--tool-name", tool]
    if args:
        flags += ["--tool-arg", *(f"{k}={v}" for k, v in args.items())]
    return inspector(exe, url, *flags)


def ok(result, what):
    check("cli_error" not in result and not result.get("isError"), f"{what}: {result}")
    return result["structuredContent"]


def main():
    exe, url = sys.argv[1:]
    tools = {t["name"]: t for t in inspector(exe, url, "--method", "tools/list")["tools"]}
    run_code = tools["run_code"]["inputSchema"]
    check(run_code["properties"]["timeout_seconds"]["type"] == ["number", "null"], f"schema: {run_code}")
    language = run_code["$defs"]["LanguageArg"]["oneOf"]
    check([v["const"] for v in language] == ["python", "javascript", "typescript", "bash"], f"languages: {language}")

    for lang, code, out in [
        ("Python", "print(6 * 7)", "42\n"),
        ("py", "print('py')", "py\n"),
        ("JS", "console.log('js')", "js\n"),
        ("node", "console.log('node')", "node\n"),
        ("TypeScript", "const n: number = 3; console.log(n)", "3\n"),
        ("sh", "echo sh", "sh\n"),
    ]:
        s = ok(call(exe, url, "run_code", code=code, language=lang, timeout_seconds="20"), lang)
        check(s["stdout"] == out, f"{lang}: {s}")
    s = call(exe, url, "run_code", code="import time; time.sleep(20)", timeout_seconds="1")["structuredContent"]
    check(s["timed_out"] is True, f"a timeout given as text is a timeout: {s}")

    s = ok(call(exe, url, "create_sandbox", timeout_seconds="120", metadata='{"by": "inspector"}'), "create")
    sid = s["sandbox_id"]
    check(s["timeout_seconds"] == 120 and s["metadata"] == {"by": "inspector"}, f"create: {s}")
    ok(call(exe, url, "write_file", sandbox_id=sid, path="a.txt", content="abcdef", append="false"), "write")
    s = ok(call(exe, url, "read_file", sandbox_id=sid, path="a.txt", offset="2", length="3"), "read")
    check(s["content"] == "cde", f"read: {s}")
    s = ok(call(exe, url, "run_command", sandbox_id=sid, command="sleep 0.2; echo bg", background="true"), "background")
    s = ok(call(exe, url, "read_process_output", sandbox_id=sid, process_id=s["process_id"], wait_seconds="10"), "read output")
    check(s["stdout"] == "bg\n", f"read_process_output: {s}")
    s = ok(call(exe, url, "set_sandbox_timeout", sandbox_id=sid, timeout_seconds="60"), "timeout")
    check(s["timeout_seconds"] == 60, f"set_sandbox_timeout: {s}")
    ok(call(exe, url, "close_sandbox", sandbox_id=sid), "close")
    print(f"MCP Inspector CLI over {url}: ok")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"MCP Inspector CLI check failed: {e}", file=sys.stderr)
        sys.exit(1)
