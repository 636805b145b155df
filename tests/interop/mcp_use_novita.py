"""The novita-tutorial profile through mcp-use, the client of its seed (000).

Usage:
    mcp_use_novita.py --url http://127.0.0.1:PORT/mcp --key KEY

Connects as the tutorial's client does (an mcpServers map with "url" and "auth") and calls
the tools the way its MCPAgent does, through mcp-use's LangChain adapter, without a model:
each answer must reach the agent as the tutorial's server answered it. mcp-use treats an
isError result as a failure (it logs "Error parsing tool result" with the error and hands
the model an error), so no answer here may set it, failures included. Also the session API
the tutorial uses to stop a sandbox itself. The server must run with a --data-dir holding
user_stock_portfolio.json. Exits 0 when every check holds, 1 with the failed check.
"""

import argparse
import asyncio
import json
import logging
import os
import sys

os.environ.setdefault("MCP_USE_ANONYMIZED_TELEMETRY", "false")

from mcp_use import MCPClient  # noqa: E402
from mcp_use.agents.adapters.langchain_adapter import LangChainAdapter  # noqa: E402


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Errors(logging.Handler):
    """Every error mcp-use logs."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        self.records.append(self.format(record))


async def flow(client, errors):
    tools = {t.name: t for t in await LangChainAdapter().create_tools(client)}
    check(
        sorted(tools) == ["create_sandbox_session", "run_on_command_line", "run_python_code", "stop_sandbox_session"],
        f"tools {sorted(tools)}",
    )

    async def run(name, **args):
        answer = await tools[name].ainvoke(args)
        check(isinstance(answer, str), f"{name} reached the agent as an error: {answer!r}")
        check(not errors.records, f"mcp-use logged errors for {name}: {errors.records}")
        return answer

    created = await run("create_sandbox_session")
    prefix = "Successfully created sandbox. Sandbox ID: "
    check(created.startswith(prefix), f"create: {created}")
    sid = created[len(prefix):]

    v = json.loads(await run("run_python_code", python_code="import math\nx = math.factorial(5)\nprint(x)", sandbox_id=sid))
    check(v == {"outputs": [], "logs": {"stdout": ["120\n"], "stderr": []}, "error": None}, f"run: {v}")
    v = json.loads(await run("run_python_code", python_code="x * 2", sandbox_id=sid))
    check(v["outputs"] == [{"text": "240", "is_main_result": True}], f"state kept: {v}")
    # An exception in the code: the error object, as the tutorial's agent saw it.
    v = json.loads(await run("run_python_code", python_code="import yfinance", sandbox_id=sid))
    check(v["error"]["name"] == "ModuleNotFoundError" and "Traceback" in v["error"]["traceback"], f"exception: {v}")

    v = json.loads(await run("run_on_command_line", command_line="echo hi; head -c 11 /data/user_stock_portfolio.json", sandbox_id=sid))
    check(v == {"output": {"stdout": 'hi\n{"holdings"', "stderr": "", "exit_code": 0, "error": None}, "execution error": None}, f"command: {v}")
    # A command that exits non-zero: the SDK raised, the tutorial answered with its text.
    v = json.loads(await run("run_on_command_line", command_line="pip show surely-not-installed-pkg", sandbox_id=sid))
    check(v["output"] is None, f"failed command: {v}")
    check(v["execution error"].startswith("Command exited with code 1 and error:\n") and "not found" in v["execution error"], f"failed command: {v}")

    stopped = await run("stop_sandbox_session", sandbox_id=sid)
    check(stopped == f"Successfully killed Sandbox ID: {sid}", f"stop: {stopped}")
    again = await run("stop_sandbox_session", sandbox_id=sid)
    check(again.startswith(f"Failed to kill Sandbox ID: {sid}\n "), f"stop again: {again}")
    v = json.loads(await run("run_python_code", python_code="1", sandbox_id=sid))
    check(list(v) == ["error"] and sid in v["error"], f"a stopped sandbox: {v}")
    v = json.loads(await run("run_on_command_line", command_line="true", sandbox_id=sid))
    check(v["output"] is None and sid in v["execution error"], f"a stopped sandbox: {v}")

    # The tutorial's client stops the sandbox itself through a session, as a safety net.
    session = await client.create_session("stock&sandbox")
    created = await session.call_tool(name="create_sandbox_session", arguments={})
    sid = created.content[0].text[len(prefix):]
    result = await session.call_tool(name="stop_sandbox_session", arguments={"sandbox_id": sid})
    check(not result.isError and result.content[0].text == f"Successfully killed Sandbox ID: {sid}", f"session stop: {result}")
    resource = await session.read_resource("data://user_stock_portfolio")
    check("holdings" in resource.contents[0].text, f"resource: {resource}")
    prompt = await session.get_prompt("instructions_for_sandbox_use")
    check("create_sandbox_session()" in prompt.messages[0].content.text, f"prompt: {prompt}")


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args()
    errors = Errors()
    logging.getLogger("mcp_use").addHandler(errors)
    client = MCPClient({"mcpServers": {"stock&sandbox": {"url": a.url, "auth": a.key}}})
    try:
        await flow(client, errors)
    finally:
        await client.close_all_sessions()
    print(f"mcp-use, profile novita-tutorial over {a.url}: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"mcp-use check failed: {e}", file=sys.stderr)
        sys.exit(1)
