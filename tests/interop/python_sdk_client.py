"""runbox through the official MCP Python SDK (PyPI `mcp`): an external client no one here wrote.

Usage:
    python_sdk_client.py --mode legacy|auto|2026-07-28 (--url http://127.0.0.1:PORT/mcp | --stdio RUNBOX [ARGS...])

Runs the core flow (tools and their schemas, a sandbox with state across calls, a command,
files in and out, resource links and resources, the prompt, status and list, errors, close,
a one-shot run with progress, arguments as models send them, an unknown tool) and exits 0
when every check holds, 1 with the failed check otherwise.
"""

import argparse
import asyncio
import base64
import sys

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def core_flow(client, mode):
    version = client.protocol_version
    expected_version = {"legacy": "2025-11-25", "auto": "2026-07-28"}.get(mode, mode)
    check(version == expected_version, f"negotiated {version}")
    if mode in ("legacy", "auto"):
        # A pinned modern version skips server/discover, so there is no identity to check.
        check(client.server_info is not None and client.server_info.name == "runbox", "server info")

    tools = {t.name: t for t in (await client.list_tools()).tools}
    expected = {
        "run_code", "run_command", "create_sandbox", "list_sandboxes", "get_sandbox_status", "close_sandbox",
        "list_files", "read_file", "write_file",
        "read_process_output", "kill_process", "pause_sandbox", "resume_sandbox", "set_sandbox_timeout",
        "install_packages",
    }
    check(set(tools) == expected, f"tools {sorted(tools)}")
    for t in tools.values():
        check(t.output_schema is not None, f"{t.name} has an output schema")
        check(t.annotations is not None, f"{t.name} has annotations")
    check(tools["list_sandboxes"].annotations.read_only_hint is True, "list_sandboxes is read-only")

    created = await client.call_tool("create_sandbox", {"metadata": {"by": "python-sdk"}})
    check(not created.is_error, f"create_sandbox: {created.content}")
    sid = created.structured_content["sandbox_id"]

    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "import math\nvalue = math.factorial(5)"})
    check(not r.is_error, f"run_code 1: {r.content}")
    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "print('value is', value)\nvalue * 2"})
    s = r.structured_content
    check(s["stdout"] == "value is 120\n", f"state kept: {s}")
    check(s["results"][0]["data"]["text/plain"] == "240", f"last value: {s}")
    check("240" in r.content[0].text, "readable text carries the value")

    r = await client.call_tool("run_command", {"sandbox_id": sid, "command": "echo $X; pwd", "env": {"X": "y"}, "cwd": "/tmp"})
    check(r.structured_content["stdout"] == "y\n/tmp\n", f"run_command: {r.structured_content}")
    check(r.structured_content["exit_code"] == 0, "exit code 0")

    await files_flow(client, sid)

    r = await client.call_tool("get_sandbox_status", {"sandbox_id": sid})
    check(r.structured_content["state"] == "running", f"status: {r.structured_content}")
    check("python" in r.structured_content["kernels"], "python kernel running")
    r = await client.call_tool("list_sandboxes", {})
    check(any(x["sandbox_id"] == sid and x["metadata"] == {"by": "python-sdk"} for x in r.structured_content["sandboxes"]), "listed")

    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "raise KeyError('missing')"})
    check(r.is_error, "an exception is an error result")
    check(r.structured_content["error"]["name"] == "KeyError", f"error name: {r.structured_content}")
    check("Traceback" in r.structured_content["error"]["traceback"], "traceback")

    r = await client.call_tool("close_sandbox", {"sandbox_id": sid})
    check(not r.is_error and r.structured_content["closed"] is True, "closed")
    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "1"})
    check(r.is_error and "create_sandbox" in r.content[0].text, f"closed sandbox: {r.content}")

    progress = []

    async def on_progress(value, total, message):
        progress.append(message or "")

    r = await client.call_tool(
        "run_code",
        {"code": "import time\nprint('tick', flush=True)\ntime.sleep(0.5)\nprint('tock')", "language": "python"},
        progress_callback=on_progress,
    )
    check(r.structured_content["stdout"] == "tick\ntock\n", f"one-shot: {r.structured_content}")
    check(r.structured_content["ephemeral"] is True, "one-shot sandbox is ephemeral")
    check("tick" in "".join(progress), f"progress notifications carried the output: {progress}")

    r = await client.call_tool("run_code", {"code": "console.log([1,2,3].map(x => x * 2).join(','))", "language": "javascript"})
    check(r.structured_content["stdout"] == "2,4,6\n", f"javascript: {r.structured_content}")

    # Arguments as models send them: numbers as text, languages in any case or by alias.
    r = await client.call_tool("run_code", {"code": "print('py')", "language": "Py", "timeout_seconds": "30"})
    check(not r.is_error and r.structured_content["stdout"] == "py\n", f"liberal arguments: {r.content}")
    r = await client.call_tool("run_code", {"code": "console.log('node')", "language": "Node", "env": '{"A": "1"}'})
    check(not r.is_error and r.structured_content["stdout"] == "node\n", f"liberal arguments: {r.content}")
    # An unknown tool: its name and the tools there are.
    try:
        await client.call_tool("run_python", {"code": "1"})
        check(False, "an unknown tool answered")
    except MCPError as e:
        check("run_python" in str(e) and "run_code" in str(e) and "create_sandbox" in str(e), f"unknown tool: {e}")


async def files_flow(client, sid):
    """Binary bytes in and out exactly, a run's new file as a resource link, resources, the prompt."""
    blob = bytes(range(256)) * 3
    r = await client.call_tool(
        "write_file",
        {"sandbox_id": sid, "path": "in/blob.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"},
    )
    check(not r.is_error and r.structured_content["size"] == len(blob), f"write_file: {r.content}")
    r = await client.call_tool("read_file", {"sandbox_id": sid, "path": "/workspace/in/blob.bin"})
    s = r.structured_content
    check(s["encoding"] == "base64" and base64.b64decode(s["content"]) == blob, f"read_file round trip: {s}")
    r = await client.call_tool("list_files", {"sandbox_id": sid, "recursive": True})
    listed = {e["path"]: e for e in r.structured_content["entries"]}
    check(listed.get("/workspace/in/blob.bin", {}).get("size") == len(blob), f"list_files: {listed}")

    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "open('report.md', 'w').write('# done\\n')"})
    links = [c for c in r.content if getattr(c, "type", None) == "resource_link"]
    check(len(links) == 1 and str(links[0].uri).endswith("/files/workspace/report.md"), f"resource link: {r.content}")
    read = await client.read_resource(str(links[0].uri))
    check(read.contents[0].text == "# done\n", f"resource read: {read.contents}")

    templates = (await client.list_resource_templates()).resource_templates
    check([t.uri_template for t in templates] == ["sandbox://{sandbox_id}/files/{path}"], f"templates: {templates}")
    prompts = (await client.list_prompts()).prompts
    check([p.name for p in prompts] == ["sandbox_instructions"], f"prompts: {prompts}")
    prompt = await client.get_prompt("sandbox_instructions")
    check("close_sandbox" in prompt.messages[0].content.text, f"prompt: {prompt.messages}")


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--url")
    g.add_argument("--stdio", nargs=argparse.REMAINDER)
    p.add_argument("--token", help="a runbox token, sent as Authorization: Bearer TOKEN")
    a = p.parse_args()
    if a.url and a.token:
        headers = {"Authorization": f"Bearer {a.token}"}
        server = streamable_http_client(a.url, http_client=create_mcp_http_client(headers=headers))
    else:
        server = a.url or StdioServerParameters(command=a.stdio[0], args=a.stdio[1:])
    async with Client(server, mode=a.mode, read_timeout_seconds=120) as client:
        await core_flow(client, a.mode)
    where = a.url or "stdio"
    print(f"python SDK ({a.mode}) over {where}: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"python SDK check failed: {e}", file=sys.stderr)
        sys.exit(1)
