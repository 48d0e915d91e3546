#!/usr/bin/env python3
"""Interop fixture: an MCP server built on the official Python SDK (`mcp` 2.3.0).

Serves both protocol eras on one endpoint: 2026-07-28 (stateless, `server/discover`)
and the initialize era (2024-11-05 .. 2025-11-25, `Mcp-Session-Id`).

  --transport http|stdio   default http; HTTP serves POST/GET/DELETE /mcp and GET /stats
  --json-response          HTTP: legacy era answers with application/json instead of SSE
  --ttl-ms N               cache hint ttlMs on discover/list/read results (default 60000)
  --cache-scope S          public|private (default public)
  --host H                 bind address (default 127.0.0.1)
  --port P                 port (default 0: picked by the OS)
  --input-tools            also register `ask` and `roots`, which ask the client mid-call

HTTP prints exactly one line `LISTENING <port>` on stdout once it accepts connections.
All logging goes to stderr. See README.md for the tool list.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from collections import Counter
from typing import Annotated, Any

import anyio
from mcp.server import CacheHint, NotificationOptions
from mcp.server.mcpserver import Context, Elicit, ListRoots, MCPServer, Resolve, Sample
from mcp_types import CreateMessageResult, ListRootsResult, SamplingMessage, TextContent
from pydantic import BaseModel
from mcp_types.methods import CACHEABLE_METHODS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = logging.getLogger("py_server")

# Counters exposed at GET /stats. `requests`/`notifications` count JSON-RPC messages by method as
# they arrive in POST bodies on /mcp (before the SDK validates headers/sessions, so a request the
# transport rejects still counts); `dispatched` counts requests that reached the SDK's handler
# chain (ServerMiddleware); `http` counts raw HTTP hits on /mcp by HTTP method.
REQUESTS: Counter[str] = Counter()
NOTIFICATIONS: Counter[str] = Counter()
DISPATCHED: Counter[str] = Counter()
HTTP: Counter[str] = Counter()
SLOW: Counter[str] = Counter({"started": 0, "completed": 0, "cancelled": 0})  # `slow` tool outcomes

# Legacy (initialize-era) connections seen, so add_tool can tell every live session.
_LEGACY_SESSIONS: dict[int, Any] = {}
_DYNAMIC_TOOLS: set[str] = set()


class Person(BaseModel):
    name: str


# Resolvers for the `--input-tools` tools. The SDK's way to ask the client mid-call: on
# 2026-07-28 it batches these into an `input_required` result and re-runs the tool on the retry;
# on the initialize era it runs `ctx.elicit` (and the sampling / roots requests) on the call's
# stream. A bare `ctx.elicit` inside a 2026-07-28 request has no back channel in mcp 2.3.0.
async def ask_person(ctx: Context) -> Elicit[Person]:
    return Elicit("name?", Person)


async def ask_capital(ctx: Context) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text="capital of France?"))],
        max_tokens=10,
    )


async def ask_roots(ctx: Context) -> ListRoots:
    return ListRoots()


def add_input_tools(mcp: MCPServer) -> None:
    @mcp.tool(description="Elicit a name, then sample the client, then report both", structured_output=False)
    async def ask(
        person: Annotated[Person, Resolve(ask_person)],
        capital: Annotated[CreateMessageResult, Resolve(ask_capital)],
    ) -> str:
        return f"name={person.name}; sampled={getattr(capital.content, 'text', capital.content)}"

    @mcp.tool(description="List the client's roots", structured_output=False)
    async def roots(listed: Annotated[ListRootsResult, Resolve(ask_roots)]) -> str:
        return ",".join(str(r.uri) for r in listed.roots)


def build_server(ttl_ms: int, cache_scope: str, page_size: int = 0) -> MCPServer:
    hint = CacheHint(ttl_ms=ttl_ms, scope=cache_scope)  # type: ignore[arg-type]
    mcp = MCPServer(
        "portico-interop-python",
        version="1.0.0",
        instructions="portico interop fixture (python)",
        cache_hints={m: hint for m in CACHEABLE_METHODS},  # type: ignore[misc]
        log_level="WARNING",
    )

    # Legacy era: advertise tools.listChanged (the modern era derives it from
    # subscriptions/listen being served, which MCPServer does by default).
    ll = mcp._lowlevel_server  # pyright: ignore[reportPrivateUsage]
    orig_init_opts = ll.create_initialization_options

    def create_initialization_options(notification_options=None, experimental_capabilities=None, extensions=None):
        return orig_init_opts(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )

    ll.create_initialization_options = create_initialization_options  # type: ignore[method-assign]

    async def count_middleware(ctx: Any, call_next: Any) -> Any:
        if ctx.request_id is not None:
            DISPATCHED[ctx.method] += 1
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                conn = getattr(ctx.session, "_connection", None)
                if conn is not None:
                    _LEGACY_SESSIONS[id(conn)] = ctx.session
        return await call_next(ctx)

    mcp.middleware.append(count_middleware)

    async def page_middleware(ctx: Any, call_next: Any) -> Any:
        # --page-size N: tools/list answers in pages of N (cursor = the next offset), so
        # clients and gateways can be tested on real multi-page lists.
        result = await call_next(ctx)
        if page_size <= 0 or ctx.method != "tools/list" or result is None:
            return result
        cursor = (ctx.params or {}).get("cursor")
        start = int(cursor) if isinstance(cursor, str) and cursor.isdigit() else 0
        end = start + page_size
        if isinstance(result, dict):
            tools = list(result.get("tools", []))
            page = {**result, "tools": tools[start:end]}
            page.pop("nextCursor", None)
            if end < len(tools):
                page["nextCursor"] = str(end)
            return page
        tools = list(result.tools)
        return result.model_copy(
            update={"tools": tools[start:end], "next_cursor": str(end) if end < len(tools) else None}
        )

    mcp.middleware.append(page_middleware)

    @mcp.tool(description="Echo the text back", structured_output=False)
    def echo(text: str) -> str:
        return text

    @mcp.tool(description="Add two integers", structured_output=False)
    def add(a: int, b: int) -> str:
        return str(a + b)

    @mcp.tool(description="Send `steps` progress notifications, then return", structured_output=False)
    async def progress(steps: int, ctx: Context) -> str:
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
            await anyio.sleep(0.05)
        return f"done {steps}"

    @mcp.tool(description="Sleep `ms` milliseconds", structured_output=False)
    async def slow(ms: int) -> str:
        SLOW["started"] += 1
        try:
            await anyio.sleep(ms / 1000)
        except anyio.get_cancelled_exc_class():
            SLOW["cancelled"] += 1
            raise
        SLOW["completed"] += 1
        return f"slept {ms}"

    @mcp.tool(description="Register a new echo-like tool and announce tools/list_changed", structured_output=False)
    async def add_tool(name: str, ctx: Context) -> str:
        def dynamic(text: str = "") -> str:
            return text

        if name in _DYNAMIC_TOOLS:
            return f"added {name}"
        _DYNAMIC_TOOLS.add(name)
        mcp.add_tool(dynamic, name=name, description=f"dynamic echo tool {name}", structured_output=False)
        # 2026-07-28: subscriptions/listen streams.
        await ctx.notify_tools_changed()
        # Initialize era: every live legacy session (standalone GET stream on HTTP, stdout on stdio).
        for key, session in list(_LEGACY_SESSIONS.items()):
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # dead session
                log.debug("dropping legacy session %s: %r", key, exc)
                _LEGACY_SESSIONS.pop(key, None)
        return f"added {name}"

    @mcp.tool(description="Announce notifications/resources/updated for `uri` to subscriptions/listen streams", structured_output=False)
    async def touch(uri: str, ctx: Context) -> str:
        await ctx.notify_resource_updated(uri)
        return f"touched {uri}"

    @mcp.tool(description="Log `<tag>:<level>` at debug, info, warning and error on this request", structured_output=False)
    async def log(tag: str, ctx: Context) -> str:
        for level in ("debug", "info", "warning", "error"):
            await ctx.log(level, f"{tag}:{level}")  # type: ignore[arg-type]
        return "logged"

    @mcp.tool(description="Return the Authorization header this server saw, or 'none'", structured_output=False)
    def whoami(ctx: Context) -> str:
        headers = ctx.headers
        if headers is None:
            return "none"
        return headers.get("authorization") or "none"

    @mcp.resource("demo://greeting", name="greeting", mime_type="text/plain", description="A greeting")
    def greeting() -> str:
        return "hello from python"

    @mcp.prompt(description="Greet someone")
    def greet(name: str) -> str:
        return f"Hello, {name}!"

    return mcp


def stats_payload() -> dict[str, Any]:
    return {
        "requests": dict(REQUESTS),
        "notifications": dict(NOTIFICATIONS),
        "dispatched": dict(DISPATCHED),
        "http": dict(HTTP),
        "slow": dict(SLOW),
    }


def count_body(body: bytes) -> None:
    try:
        msg = json.loads(body)
    except ValueError:
        return
    for m in msg if isinstance(msg, list) else [msg]:
        if isinstance(m, dict) and isinstance(m.get("method"), str):
            (NOTIFICATIONS if "id" not in m else REQUESTS)[m["method"]] += 1


def wrap_app(app: Any) -> Any:
    """ASGI wrapper: serve GET /stats, count raw HTTP hits on everything else."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["path"] == "/stats":
                body = json.dumps(stats_payload()).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            if scope["path"].rstrip("/") == "/mcp":
                HTTP[scope["method"]] += 1
                if scope["method"] == "POST":
                    # Read the whole body to count it, then replay it to the SDK.
                    buffered: list[dict[str, Any]] = []
                    chunks: list[bytes] = []
                    while True:
                        message = await receive()
                        buffered.append(message)
                        if message["type"] != "http.request":
                            break
                        chunks.append(message.get("body", b""))
                        if not message.get("more_body", False):
                            break
                    count_body(b"".join(chunks))

                    async def replay() -> dict[str, Any]:
                        if buffered:
                            return buffered.pop(0)
                        return await receive()

                    await app(scope, replay, send)
                    return
        await app(scope, receive, send)

    return wrapped


async def serve_http(mcp: MCPServer, host: str, json_response: bool, port: int = 0) -> None:
    import uvicorn

    app = wrap_app(mcp.streamable_http_app(streamable_http_path="/mcp", json_response=json_response, host=host))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]

    # Bounded graceful shutdown: open SSE streams (listen, GET) would otherwise hold SIGTERM forever.
    config = uvicorn.Config(
        app, log_config=None, access_log=False, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.01)
        # A fixture has nothing to flush: exit at once on SIGTERM/SIGINT instead of uvicorn's
        # graceful shutdown, which waits on open SSE streams (listen, GET).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: os._exit(0))
        sys.stdout.write(f"LISTENING {port}\n")
        sys.stdout.flush()

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", choices=["http", "stdio"], default="http")
    p.add_argument("--json-response", action="store_true")
    p.add_argument("--ttl-ms", type=int, default=60000)
    p.add_argument("--cache-scope", choices=["public", "private"], default="public")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = picked by the OS")
    p.add_argument("--page-size", type=int, default=0, help="tools/list page size (0 = one page)")
    p.add_argument("--input-tools", action="store_true", help="register `ask` and `roots`")
    args = p.parse_args()

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="py_server %(levelname)s %(name)s: %(message)s")
    mcp = build_server(args.ttl_ms, args.cache_scope, args.page_size)
    if args.input_tools:
        add_input_tools(mcp)
    if args.transport == "stdio":
        anyio.run(mcp.run_stdio_async)
    else:
        try:
            anyio.run(serve_http, mcp, args.host, args.json_response, args.port)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
