"""Big answers through the official MCP Python SDK 2.x (PyPI `mcp`) over streamable HTTP.

Usage:
    python_sdk_big.py --mode legacy|auto --url http://127.0.0.1:PORT/mcp

The SDK drops its whole session on any server-sent event over 1 MiB, so every answer must
stay under that. This reads a 2 MB file with read_file (in parts: `more`, `offset`), gets an
800x800 figure of noise from matplotlib (megabytes of PNG: a resource_link, read in pieces
with resources/read URI?offset=N&length=M), a small figure (image content, its bytes once,
a reference in structuredContent), and checks the session goes on after each. Exits 0 when
every check holds, 1 with the failed check otherwise, 2 when the session died.
"""

import argparse
import asyncio
import base64
import hashlib
import struct
import sys

from mcp import Client

NOISY_FIGURE = """\
import numpy as np
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(8, 8), dpi=100)
ax = fig.add_axes([0, 0, 1, 1])
ax.imshow(np.random.default_rng(7).random((800, 800, 3)), interpolation='nearest')
ax.axis('off')
plt.show()
"""

BIG_FILE = """\
import hashlib, os
data = os.urandom(1_500_000).hex()[:2_000_000].encode()
open('big.txt', 'wb').write(data)
hashlib.sha256(data).hexdigest()
"""


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def png_size(png):
    check(png[:8] == b"\x89PNG\r\n\x1a\n", "a PNG")
    return struct.unpack(">II", png[16:24])


async def alive(client, sid):
    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": "6 * 7"})
    check(r.structured_content["results"][0]["data"]["text/plain"] == "42", f"session goes on: {r}")


async def read_in_pieces(client, uri, size, piece):
    got = b""
    while len(got) < size:
        r = await client.read_resource(f"{uri}?offset={len(got)}&length={piece}")
        part = base64.b64decode(r.contents[0].blob)
        check(0 < len(part) <= piece, f"a piece of {len(part)} bytes")
        got += part
    return got


async def flow(client):
    r = await client.call_tool("create_sandbox", {})
    sid = r.structured_content["sandbox_id"]

    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": BIG_FILE})
    check(not r.is_error, f"making the file: {r.content}")
    digest = r.structured_content["results"][0]["data"]["text/plain"].strip("'")
    content, calls = "", 0
    while True:
        r = await client.call_tool("read_file", {"sandbox_id": sid, "path": "big.txt", "offset": len(content)})
        check(not r.is_error, f"read_file: {r.content}")
        s = r.structured_content
        content += s["content"]
        calls += 1
        if not s["more"]:
            break
    check(len(content) == 2_000_000 and s["size"] == 2_000_000, f"read {len(content)} bytes")
    check(hashlib.sha256(content.encode()).hexdigest() == digest, "the file arrived whole")
    check(calls > 2, f"read in {calls} parts")
    await alive(client, sid)

    r = await client.call_tool("run_code", {"sandbox_id": sid, "code": NOISY_FIGURE})
    check(not r.is_error, f"the figure: {r.content}")
    links = [c for c in r.content if c.type == "resource_link"]
    check(len(links) == 1 and links[0].mime_type == "image/png", f"a link to the figure: {r.content}")
    check(not any(c.type == "image" for c in r.content), "too big to go inline")
    link = links[0]
    ref = r.structured_content["results"][0]["data"]["image/png"]
    check(ref == {"uri": str(link.uri), "size": link.size}, f"reference {ref}")
    check(link.size > 1 << 20, f"a figure of {link.size} bytes")
    png = await read_in_pieces(client, str(link.uri), link.size, 256 << 10)
    check(len(png) == link.size, "the figure arrived whole")
    w, h = png_size(png)
    check(w >= 800 and h >= 800, f"{w}x{h}")
    await alive(client, sid)

    r = await client.call_tool(
        "run_code",
        {"sandbox_id": sid, "code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2))\nplt.plot([1, 3, 2])\nplt.show()"},
    )
    images = [c for c in r.content if c.type == "image"]
    check(len(images) == 1, f"a small figure inline: {r.content}")
    ref = r.structured_content["results"][0]["data"]["image/png"]
    check(isinstance(ref, dict) and set(ref) == {"uri", "size"}, f"a reference, not the bytes again: {ref}")
    whole = await client.read_resource(ref["uri"])
    check(whole.contents[0].blob == images[0].data, "the reference reads the same image")
    await alive(client, sid)
    await client.call_tool("close_sandbox", {"sandbox_id": sid})


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--url", required=True)
    a = p.parse_args()
    async with Client(a.url, mode=a.mode, read_timeout_seconds=120) as client:
        await flow(client)
    print(f"python SDK ({a.mode}), big answers over {a.url}: ok")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"python SDK big-answer check failed: {e}", file=sys.stderr)
        sys.exit(1)
    except BaseException as e:  # the SDK's session died: an ExceptionGroup, a closed stream
        print(f"python SDK session died: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
