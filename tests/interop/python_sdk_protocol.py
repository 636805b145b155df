"""The optional parts of the protocol runbox serves, through the official MCP Python SDK.

Usage:
    python_sdk_protocol.py --mode legacy|auto|2026-07-28 (--url http://127.0.0.1:PORT/mcp [--token T] | --stdio RUNBOX [ARGS...])

Checks, each as the negotiated revision defines it:
  - logging: with the 2025-11-25 handshake, logging/setLevel and the session's
    notifications/message; on 2026-07-28, logging/setLevel is gone and a request's own
    log level (Client(log_level=...)) brings the messages on its response, none without;
  - completions: completion/complete for the sandbox file template's sandbox_id and path;
  - resource subscriptions: resources/subscribe (2025-11-25) or subscriptions/listen
    (2026-07-28) to a sandbox file, updated after a run changes it;
  - tasks (2026-07-28: the SDK's extension mechanism with a claim for resultType "task"):
    run_code and run_command longer than the call waits come back as tasks, polled with
    tasks/get to their result, and tasks/cancel interrupts a run.
Exits 0 when every check holds, 1 with the failed check otherwise.
"""

import argparse
import asyncio
import sys
import warnings
from typing import Any, Literal

import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import ConfigDict, Field, TypeAdapter

warnings.simplefilter("ignore")  # the SDK marks logging and resources/subscribe deprecated

TEMPLATE = "sandbox://{sandbox_id}/files/{path}"
TASKS = "io.modelcontextprotocol/tasks"
WAIT = 60
ANY = TypeAdapter(dict[str, Any])


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def wait_for_file(name):
    return (
        "import os, time\n"
        f"while not os.path.exists('/workspace/{name}'):\n"
        "    time.sleep(0.05)\n"
        "print('released')\n"
        "'value'"
    )


async def until(what, cond):
    """Waits (up to WAIT s) for cond() to hold, woken by the recorder."""
    async with asyncio.timeout(WAIT):
        while not cond():
            await asyncio.sleep(0.02)


class Recorder:
    """Log messages and resource updates a client receives."""

    def __init__(self):
        self.logs = []
        self.updates = []

    async def on_log(self, params):
        self.logs.append(params)

    async def on_message(self, message):
        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))

    def events(self, event, sandbox):
        return [m for m in self.logs if isinstance(m.data, dict) and m.data.get("event") == event and m.data.get("sandbox_id") == sandbox]


# --- the tasks extension, through the SDK's own extension interface -----------------------


class TaskIdParams(mcp_types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    name_param = "taskId"


class CancelTask(mcp_types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    name_param = "taskId"


class CreateTaskResult(mcp_types.Result):
    """The server's task handle (SEP-2663): resultType "task" and the task's fields."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    ttl_ms: int | None = Field(alias="ttlMs", default=None)
    poll_interval_ms: int | None = Field(alias="pollIntervalMs", default=None)


class Tasks(ClientExtension):
    """Declares the tasks extension and resolves a task handle by polling tasks/get, keeping
    every task it saw (and what each status was)."""

    identifier = TASKS

    def __init__(self):
        self.seen = []  # (task_id, statuses seen while polling)
        self.started = asyncio.Queue()

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def resolve(self, handle: CreateTaskResult, ctx: ClaimContext) -> mcp_types.CallToolResult:
        statuses = [handle.status]
        self.seen.append((handle.task_id, statuses))
        await self.started.put(handle.task_id)
        interval = (handle.poll_interval_ms or 1000) / 1000
        while True:
            raw: dict[str, Any] = await ctx.session.send_request(
                GetTask(method="tasks/get", params=TaskIdParams(task_id=handle.task_id)), ANY
            )
            statuses.append(raw["status"])
            if raw["status"] == "completed":
                return mcp_types.CallToolResult.model_validate(raw["result"])
            if raw["status"] in ("failed", "cancelled"):
                return mcp_types.CallToolResult(
                    content=[mcp_types.TextContent(type="text", text=f"task {raw['status']}")], is_error=True
                )
            await asyncio.sleep(min(interval, 0.2))


# --- the checks ------------------------------------------------------------------------------


async def logging_flow(connect, mode):
    rec = Recorder()
    if mode == "legacy":
        async with connect(logging_callback=rec.on_log) as client:
            await client.set_logging_level("info")
            r = await client.call_tool("create_sandbox", {})
            sid = r.structured_content["sandbox_id"]
            await until("sandbox_created", lambda: rec.events("sandbox_created", sid))
            m = rec.events("sandbox_created", sid)[0]
            check(m.level == "info" and m.logger == "runbox", f"message {m}")
            await client.call_tool("close_sandbox", {"sandbox_id": sid})
        return
    # 2026-07-28: no setLevel; only requests that carry a level hear anything.
    async with connect(logging_callback=rec.on_log) as client:
        try:
            await client.set_logging_level("info")
            raised = False
        except Exception:
            raised = True
        check(raised, "logging/setLevel is refused on 2026-07-28")
        r = await client.call_tool("create_sandbox", {})
        sid = r.structured_content["sandbox_id"]
        check(not rec.logs, f"a request without a log level heard {rec.logs}")
        await client.call_tool("close_sandbox", {"sandbox_id": sid})
    async with connect(logging_callback=rec.on_log, log_level="info") as client:
        r = await client.call_tool("create_sandbox", {})
        sid = r.structured_content["sandbox_id"]
        await until("sandbox_created", lambda: rec.events("sandbox_created", sid))
        await client.call_tool("close_sandbox", {"sandbox_id": sid})


async def completions_flow(client):
    sid = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
    await client.call_tool("write_file", {"sandbox_id": sid, "path": "report.md", "content": "x"})
    ref = mcp_types.ResourceTemplateReference(type="ref/resource", uri=TEMPLATE)
    r = await client.complete(ref, {"name": "sandbox_id", "value": sid[:8]})
    check(sid in r.completion.values, f"sandbox_id completion {r.completion}")
    r = await client.complete(ref, {"name": "path", "value": "workspace/rep"}, context_arguments={"sandbox_id": sid})
    check(r.completion.values == ["workspace/report.md"], f"path completion {r.completion}")
    r = await client.complete(ref, {"name": "path", "value": "t"}, context_arguments={"sandbox_id": sid})
    check(r.completion.values == ["tmp/"], f"area completion {r.completion}")
    await client.call_tool("close_sandbox", {"sandbox_id": sid})


async def subscriptions_flow(client, rec, mode):
    sid = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
    uri = f"sandbox://{sid}/files/workspace/out.txt"
    write = {"sandbox_id": sid, "code": "open('other.txt', 'w').write('o')\nopen('out.txt', 'w').write('x')"}
    if mode == "legacy":
        await client.subscribe_resource(uri)
        r = await client.call_tool("run_code", write)
        check(not r.is_error, f"run: {r.content}")
        await until("resources/updated", lambda: uri in rec.updates)
        check(rec.updates == [uri], f"only the subscribed file: {rec.updates}")
        await client.unsubscribe_resource(uri)
    else:
        async with client.listen(resource_subscriptions=[uri]) as sub:
            check(list(sub.honored.resource_subscriptions or []) == [uri], f"honored {sub.honored}")
            r = await client.call_tool("run_code", write)
            check(not r.is_error, f"run: {r.content}")
            async with asyncio.timeout(WAIT):
                event = await sub.__anext__()
            check(getattr(event, "uri", None) == uri, f"listen event {event}")
    await client.call_tool("close_sandbox", {"sandbox_id": sid})


async def tasks_flow(connect):
    tasks = Tasks()
    async with connect(extensions=[tasks]) as client:
        sid = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]

        async def release(name):
            await tasks.started.get()
            await client.call_tool("write_file", {"sandbox_id": sid, "path": name, "content": ""})

        # A run longer than the call waits: a task, polled (working, then completed).
        r, _ = await asyncio.gather(
            client.call_tool("run_code", {"sandbox_id": sid, "code": wait_for_file("go")}), release("go")
        )
        check(not r.is_error and r.structured_content["stdout"] == "released\n", f"task result {r}")
        task_id, statuses = tasks.seen[-1]
        check(statuses[0] == "working" and statuses[-1] == "completed", f"statuses {statuses}")
        check("working" in statuses[1:], f"polled while working: {statuses}")

        r, _ = await asyncio.gather(
            client.call_tool(
                "run_command",
                {"sandbox_id": sid, "command": "while [ ! -f go2 ]; do sleep 0.05; done; echo done"},
            ),
            release("go2"),
        )
        check(r.structured_content["stdout"] == "done\n", f"run_command task {r.structured_content}")

        # tasks/cancel interrupts the run: the kernel answers at once afterwards.
        async def cancel():
            task = await tasks.started.get()
            await client.session.send_request(CancelTask(method="tasks/cancel", params=TaskIdParams(task_id=task)), ANY)

        r, _ = await asyncio.gather(
            client.call_tool("run_code", {"sandbox_id": sid, "code": wait_for_file("never")}), cancel()
        )
        check(r.is_error and tasks.seen[-1][1][-1] == "cancelled", f"cancelled task {tasks.seen[-1]}")
        r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "6 * 7", "timeout_seconds": 20})
        check(r.structured_content["results"][0]["data"]["text/plain"] == "42", f"after cancel {r.structured_content}")
        await client.call_tool("close_sandbox", {"sandbox_id": sid})


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--url")
    g.add_argument("--stdio", nargs=argparse.REMAINDER)
    p.add_argument("--token", help="a runbox token, sent as Authorization: Bearer TOKEN")
    a = p.parse_args()

    def connect(**kwargs):
        if a.url and a.token:
            headers = {"Authorization": f"Bearer {a.token}"}
            server = streamable_http_client(a.url, http_client=create_mcp_http_client(headers=headers))
        else:
            server = a.url or StdioServerParameters(command=a.stdio[0], args=a.stdio[1:])
        return Client(server, mode=a.mode, read_timeout_seconds=120, **kwargs)

    legacy = a.mode == "legacy"
    await logging_flow(connect, a.mode)
    rec = Recorder()
    async with connect(message_handler=rec.on_message) as client:
        check(client.protocol_version == ("2025-11-25" if legacy else "2026-07-28"), client.protocol_version)
        await completions_flow(client)
        await subscriptions_flow(client, rec, "legacy" if legacy else "modern")
    if not legacy:
        await tasks_flow(connect)
    print(f"python SDK protocol features ({a.mode}) over {a.url or 'stdio'}: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"python SDK check failed: {e}", file=sys.stderr)
        sys.exit(1)
