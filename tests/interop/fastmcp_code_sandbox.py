"""The code-sandbox-mcp profile through fastmcp's Client, the client of its seed (001).

Usage:
    fastmcp_code_sandbox.py RUNBOX [SERVE ARGS...]

Connects as the seed's example does (a stdio server in an mcpServers map) to
`RUNBOX serve --stdio --profile code-sandbox-mcp SERVE ARGS...` and checks the original's
answers: the trimmed stdout; llm-sandbox's ExecutionResult JSON when the code printed
nothing or failed (fastmcp raises ToolError on isError, so none of these may set it); the
TextContent the original declared as its output, which fastmcp parses into `.data`; and the
resource sandbox://environments. Exits 0 when every check holds, 1 with the failed check.
"""

import asyncio
import json
import os
import sys

from fastmcp import Client


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def only_text(result):
    check(len(result.content) == 1 and result.content[0].type == "text", f"one text block: {result.content}")
    return result.content[0].text


async def flow(client):
    tools = {t.name: t for t in await client.list_tools()}
    check(sorted(tools) == ["run_javascript_code", "run_python_code"], f"tools {sorted(tools)}")
    schema = tools["run_python_code"].output_schema
    check(schema["title"] == "TextContent", f"the original's output schema: {schema}")

    # call_tool raises ToolError on isError: every answer here must come back.
    r = await client.call_tool("run_python_code", {"code": "print('  hello  ')"})
    check(only_text(r) == "hello", f"output: {r.content}")
    check(r.structured_content == {"type": "text", "text": "hello", "annotations": None, "_meta": None}, f"structured: {r.structured_content}")
    check(getattr(r.data, "text", None) == "hello", f"fastmcp's data: {r.data!r}")

    r = await client.call_tool("run_python_code", {"code": "x = 1"})
    check(only_text(r) == '{\n  "exit_code": 1,\n  "stderr": "No output, forgot print()?",\n  "stdout": ""\n}', f"no output: {r.content}")

    r = await client.call_tool("run_python_code", {"code": "print('partial')\n1 / 0"})
    v = json.loads(only_text(r))
    check(list(v) == ["exit_code", "stderr", "stdout"], f"failure shape: {v}")
    check(v["exit_code"] == 1 and "ZeroDivisionError" in v["stderr"] and v["stdout"] == "partial", f"failure: {v}")

    r = await client.call_tool("run_javascript_code", {"code": "console.log([1, 2].map(x => x * 3).join(' '))"})
    check(only_text(r) == "3 6", f"javascript: {r.content}")
    r = await client.call_tool("run_javascript_code", {"code": "let y = 2"})
    check(json.loads(only_text(r))["stderr"] == "No output, forgot console.logs?", f"javascript, no output: {r.content}")
    r = await client.call_tool("run_javascript_code", {"code": "undefinedFunction()"})
    v = json.loads(only_text(r))
    check(v["exit_code"] == 1 and "ReferenceError" in v["stderr"], f"javascript failure: {v}")

    # Each call in a fresh sandbox.
    r = await client.call_tool("run_python_code", {"code": "print('x' in globals())"})
    check(only_text(r) == "False", f"fresh sandbox: {r.content}")

    resources = await client.list_resources()
    check([str(x.uri) for x in resources] == ["sandbox://environments"], f"resources: {resources}")
    check(resources[0].name == "environment_details" and resources[0].mime_type == "text/plain", f"resource: {resources[0]}")
    contents = await client.read_resource("sandbox://environments")
    envs = json.loads(contents[0].text)
    check(list(envs) == ["python", "javascript"], f"environments: {envs}")
    for lang in envs.values():
        check(sorted(lang) == ["image", "installed_libraries"], f"environment: {lang}")
    check("matplotlib" in envs["python"]["installed_libraries"], f"python libraries: {envs['python']}")


async def main():
    runbox, *args = sys.argv[1:]
    config = {
        "mcpServers": {
            "local_server": {
                "transport": "stdio",
                "command": runbox,
                "args": ["serve", "--stdio", "--profile", "code-sandbox-mcp", *args],
                "env": dict(os.environ),
            }
        }
    }
    async with Client(config) as client:
        await flow(client)
    print("fastmcp, profile code-sandbox-mcp over stdio: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"fastmcp check failed: {e}", file=sys.stderr)
        sys.exit(1)
