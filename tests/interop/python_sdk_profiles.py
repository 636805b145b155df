"""runbox's compatibility profiles through the official MCP Python SDK (PyPI `mcp`).

Usage:
    python_sdk_profiles.py --profile NAME --mode legacy|auto|2026-07-28
                           (--url http://127.0.0.1:PORT/mcp [--token KEY] | --stdio RUNBOX [ARGS...])

Checks each profile's tool names, arguments and answer shapes the way a client written for
the seed server reads them (docs: README, "Compatibility profiles"), failures included: as
the originals did, the profiles answer them as ordinary content, never isError.

- novita-tutorial: create_sandbox_session, run_python_code twice with state,
  run_on_command_line, stop_sandbox_session, the errors, the data resource
  data://user_stock_portfolio and the prompt instructions_for_sandbox_use (the server must
  run with a --data-dir holding user_stock_portfolio.json);
- code-sandbox-mcp: run_python_code and run_javascript_code in fresh sandboxes, and
  --pass-through-env (the server must pass RUNBOX_TEST_PASSED through, not RUNBOX_TEST_HIDDEN;
  both are set in this process's environment, which a stdio server inherits);
- mcp-code-sandbox: sessions named by the caller, code, packages, files, create_run_close.

Exits 0 when every check holds, 1 with the failed check otherwise.
"""

import argparse
import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    check(len(texts) == 1, f"one text block: {result.content}")
    return texts[0]


def obj(result):
    """The JSON object of an answer's text block; structuredContent, if any, is the same."""
    value = json.loads(text_of(result))
    if result.structured_content is not None:
        check(result.structured_content == value, f"structuredContent {result.structured_content} != text {value}")
    return value


async def tool_args(client):
    tools = (await client.list_tools()).tools
    return {
        t.name: (sorted(t.input_schema.get("properties", {})), sorted(t.input_schema.get("required", [])))
        for t in tools
    }


async def novita(client, mode):
    args = await tool_args(client)
    check(
        args
        == {
            "create_sandbox_session": ([], []),
            "stop_sandbox_session": (["sandbox_id"], ["sandbox_id"]),
            "run_python_code": (["python_code", "sandbox_id"], ["python_code", "sandbox_id"]),
            "run_on_command_line": (["command_line", "sandbox_id"], ["command_line", "sandbox_id"]),
        },
        f"tools {args}",
    )

    r = await client.call_tool("create_sandbox_session", {})
    t = text_of(r)
    prefix = "Successfully created sandbox. Sandbox ID: "
    check(not r.is_error and t.startswith(prefix), f"create: {t}")
    check(r.structured_content == {"result": t}, f"FastMCP's str result: {r.structured_content}")
    sid = t[len(prefix):]

    r = await client.call_tool("run_python_code", {"sandbox_id": sid, "python_code": "import math\nx = math.factorial(5)\nprint('x is', x)"})
    v = obj(r)
    check(not r.is_error, f"run 1: {v}")
    check(v == {"outputs": [], "logs": {"stdout": ["x is 120\n"], "stderr": []}, "error": None}, f"run 1: {v}")
    r = await client.call_tool("run_python_code", {"sandbox_id": sid, "python_code": "x * 2"})
    v = obj(r)
    check(v["outputs"] == [{"text": "240", "is_main_result": True}], f"state kept: {v}")
    check(v["error"] is None and v["logs"] == {"stdout": [], "stderr": []}, f"run 2: {v}")

    r = await client.call_tool("run_python_code", {"sandbox_id": sid, "python_code": "raise KeyError('missing')"})
    v = obj(r)
    check(not r.is_error, "an exception is ordinary content, as the tutorial answered it")
    check(v["error"]["name"] == "KeyError" and "Traceback" in v["error"]["traceback"], f"error: {v}")

    r = await client.call_tool("run_on_command_line", {"sandbox_id": sid, "command_line": "echo hi; python3 -c 'import json; print(len(json.load(open(\"/data/user_stock_portfolio.json\"))[\"holdings\"]))'"})
    v = obj(r)
    check(v == {"output": {"stdout": "hi\n1\n", "stderr": "", "exit_code": 0, "error": None}, "execution error": None}, f"command: {v}")
    r = await client.call_tool("run_on_command_line", {"sandbox_id": sid, "command_line": "echo no >&2; exit 4"})
    v = obj(r)
    check(not r.is_error and v == {"output": None, "execution error": "Command exited with code 4 and error:\nno\n"}, f"failed command: {v}")

    resources = (await client.list_resources()).resources
    check([str(x.uri) for x in resources] == ["data://user_stock_portfolio"], f"resources: {resources}")
    read = await client.read_resource("data://user_stock_portfolio")
    check("holdings" in read.contents[0].text, f"resource: {read.contents}")
    prompts = (await client.list_prompts()).prompts
    check([p.name for p in prompts] == ["instructions_for_sandbox_use"], f"prompts: {prompts}")
    prompt = await client.get_prompt("instructions_for_sandbox_use")
    body = prompt.messages[0].content.text
    for needle in ("create_sandbox_session()", "run_python_code()", "run_on_command_line()", "stop_sandbox_session()", "pip install"):
        check(needle in body, f"prompt names {needle}: {body}")

    r = await client.call_tool("stop_sandbox_session", {"sandbox_id": sid})
    check(not r.is_error and text_of(r) == f"Successfully killed Sandbox ID: {sid}", f"stop: {r.content}")
    r = await client.call_tool("stop_sandbox_session", {"sandbox_id": sid})
    check(not r.is_error and text_of(r).startswith(f"Failed to kill Sandbox ID: {sid}\n "), f"stop again: {r.content}")
    r = await client.call_tool("run_on_command_line", {"sandbox_id": sid, "command_line": "true"})
    v = obj(r)
    check(not r.is_error and v["output"] is None and sid in v["execution error"], f"stopped sandbox: {v}")
    r = await client.call_tool("run_python_code", {"sandbox_id": sid, "python_code": "1"})
    v = obj(r)
    check(not r.is_error and list(v) == ["error"] and sid in v["error"], f"stopped sandbox: {v}")


async def code_sandbox_mcp(client, mode):
    args = await tool_args(client)
    check(args == {"run_python_code": (["code"], ["code"]), "run_javascript_code": (["code"], ["code"])}, f"tools {args}")
    check((await client.list_prompts()).prompts == [], "no prompts")

    r = await client.call_tool("run_python_code", {"code": "print(' hello ')"})
    check(not r.is_error and text_of(r) == "hello", f"python: {r.content}")
    check(r.structured_content == {"type": "text", "text": "hello", "annotations": None, "_meta": None}, f"TextContent: {r.structured_content}")
    r = await client.call_tool("run_python_code", {"code": "x = 1"})
    check(not r.is_error and json.loads(text_of(r)) == {"exit_code": 1, "stderr": "No output, forgot print()?", "stdout": ""}, f"no output: {r.content}")
    r = await client.call_tool("run_python_code", {"code": "print(x)"})
    v = json.loads(text_of(r))
    check(not r.is_error and list(v) == ["exit_code", "stderr", "stdout"] and v["exit_code"] == 1 and "NameError" in v["stderr"], f"fresh sandbox: {v}")

    r = await client.call_tool("run_javascript_code", {"code": "console.log([1, 2, 3].map(x => x * 2).join(','))"})
    check(not r.is_error and text_of(r) == "2,4,6", f"javascript: {r.content}")
    r = await client.call_tool("run_javascript_code", {"code": "const y = 2"})
    check(json.loads(text_of(r))["stderr"] == "No output, forgot console.logs?", f"no output: {r.content}")
    r = await client.call_tool("run_javascript_code", {"code": "null.x"})
    v = json.loads(text_of(r))
    check(not r.is_error and v["exit_code"] == 1 and "TypeError" in v["stderr"], f"javascript error: {v}")

    r = await client.call_tool("run_python_code", {"code": "import os\nprint(os.environ.get('RUNBOX_TEST_PASSED'), os.environ.get('RUNBOX_TEST_HIDDEN'))"})
    expected = f"{os.environ['RUNBOX_TEST_PASSED']} None"
    check(text_of(r) == expected, f"pass-through env: {r.content}, expected {expected}")


async def mcp_code_sandbox(client, mode):
    args = await tool_args(client)
    expected = {
        "create_sandbox": (["session_id"], ["session_id"]),
        "close_sandbox": (["session_id"], ["session_id"]),
        "get_sandbox_status": (["session_id"], []),
        "execute_code": (["code", "session_id"], ["code", "session_id"]),
        "install_package": (["package_name", "session_id"], ["package_name", "session_id"]),
        "create_run_close": (["code"], ["code"]),
        "list_files": (["path", "session_id"], ["session_id"]),
        "read_file": (["file_path", "session_id"], ["file_path", "session_id"]),
        "write_file": (["content", "file_path", "session_id"], ["content", "file_path", "session_id"]),
        "upload_file": (["destination_path", "file_content", "file_name", "session_id"], ["file_content", "file_name", "session_id"]),
    }
    check(args == expected, f"tools {args}")

    session = f"py-{mode}"
    r = await client.call_tool("create_sandbox", {"session_id": session})
    check(not r.is_error and text_of(r) == f"Sandbox created successfully with session ID: {session}", f"create: {r.content}")
    r = await client.call_tool("create_sandbox", {"session_id": session})
    check(not r.is_error and text_of(r) == f"Sandbox with session ID {session} already exists.", f"create twice: {r.content}")
    v = obj(await client.call_tool("get_sandbox_status", {}))
    check(v == {"active_sandbox_count": 1, "active_sessions": [session], "interpreter_type": "local"}, f"status: {v}")
    v = obj(await client.call_tool("get_sandbox_status", {"session_id": session}))
    check(v == {"status": "active", "session_id": session, "interpreter_type": "local"}, f"status: {v}")

    v = obj(await client.call_tool("execute_code", {"session_id": session, "code": "total = sum(range(10))\nprint(total)"}))
    check(v == {"logs": {"stdout": ["45\n"], "stderr": []}, "error": None}, f"execute: {v}")
    v = obj(await client.call_tool("execute_code", {"session_id": session, "code": "print(total + 1)"}))
    check(v["logs"]["stdout"] == ["46\n"], f"state kept: {v}")
    r = await client.call_tool("execute_code", {"session_id": session, "code": "1 / 0"})
    v = obj(r)
    check(not r.is_error and v["error"]["name"] == "ZeroDivisionError", f"an exception as ordinary content: {v}")
    r = await client.call_tool("execute_code", {"session_id": "nobody", "code": "1"})
    check(not r.is_error and obj(r) == {"error": "No sandbox found with session ID: nobody. Create a sandbox first."}, f"unknown session: {r.content}")

    # Every path answered is the sandbox's own, one code opens as it is.
    v = obj(await client.call_tool("write_file", {"session_id": session, "file_path": "/in/a.txt", "content": "alpha"}))
    check(v == {"path": "/workspace/in/a.txt", "message": "File written successfully"}, f"write: {v}")
    v = obj(await client.call_tool("upload_file", {"session_id": session, "file_name": "data.csv", "file_content": "x,y\n1,2\n"}))
    check(v == {"path": "/workspace/data.csv", "message": "File uploaded successfully"}, f"upload: {v}")
    v = obj(await client.call_tool("execute_code", {"session_id": session, "code": f"print(open({v['path']!r}).read().split()[1])"}))
    check(v["logs"]["stdout"] == ["1,2\n"], f"code opens the path answered: {v}")
    v = obj(await client.call_tool("list_files", {"session_id": session}))
    listed = [(f["name"], f["type"], f["path"]) for f in v["files"] if not f["name"].startswith(".")]
    check(v["path"] == "/workspace" and listed == [("data.csv", "file", "/workspace/data.csv"), ("in", "dir", "/workspace/in")], f"list: {v}")
    v = obj(await client.call_tool("list_files", {"session_id": session, "path": "/workspace/in"}))
    check(v["path"] == "/workspace/in" and [f["path"] for f in v["files"]] == ["/workspace/in/a.txt"], f"list a path answered: {v}")
    v = obj(await client.call_tool("read_file", {"session_id": session, "file_path": "/in/a.txt"}))
    check(v == {"path": "/workspace/in/a.txt", "content": "alpha"}, f"read: {v}")

    r = await client.call_tool("install_package", {"session_id": session, "package_name": "six"})
    v = obj(r)
    check(sorted(v) == ["error", "output", "package"] and v["package"] == "six", f"install: {v}")
    check(sorted(v["output"]) == ["stderr", "stdout"] and not r.is_error, f"install: {v}")

    v = obj(await client.call_tool("create_run_close", {"code": "print('once')"}))
    check(v == {"logs": {"stdout": ["once\n"], "stderr": []}, "error": None, "sandbox_status": "created and will be closed automatically", "sandbox_closed": True, "sandbox_removed": True}, f"create_run_close: {v}")

    r = await client.call_tool("close_sandbox", {"session_id": session})
    check(not r.is_error and "successfully closed" in text_of(r), f"close: {r.content}")
    r = await client.call_tool("close_sandbox", {"session_id": session})
    check(not r.is_error and "not active or has already been closed" in text_of(r), f"close twice: {r.content}")
    v = obj(await client.call_tool("get_sandbox_status", {}))
    check(v == {"active_sandbox_count": 0, "active_sessions": [], "interpreter_type": "local"}, f"status after close: {v}")


FLOWS = {"novita-tutorial": novita, "code-sandbox-mcp": code_sandbox_mcp, "mcp-code-sandbox": mcp_code_sandbox}


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--profile", required=True, choices=sorted(FLOWS))
    p.add_argument("--mode", required=True)
    p.add_argument("--token", help="sent as Authorization: Bearer TOKEN, as the tutorial's client sends its key")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--url")
    g.add_argument("--stdio", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.url:
        headers = {"Authorization": f"Bearer {a.token}"} if a.token else None
        server = streamable_http_client(a.url, http_client=create_mcp_http_client(headers=headers))
    else:
        server = StdioServerParameters(command=a.stdio[0], args=a.stdio[1:], env=dict(os.environ))
    async with Client(server, mode=a.mode, read_timeout_seconds=120) as client:
        await FLOWS[a.profile](client, a.mode)
    print(f"python SDK, profile {a.profile} ({a.mode}) over {a.url or 'stdio'}: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"python SDK profile check failed: {e}", file=sys.stderr)
        sys.exit(1)
