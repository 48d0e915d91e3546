#!/usr/bin/env python3
"""Interop fixture: an MCP client built on the official Python SDK (`mcp` 2.3.0).

Usage:
  py_client.py --url http://127.0.0.1:PORT/mcp [--header 'K: V']... [--legacy|--modern] [--tool-prefix P]
  py_client.py --sse --url http://127.0.0.1:PORT/mcp/NAME/sse ...   (the 2024-11-05 HTTP+SSE transport; legacy era)
  py_client.py [--legacy|--modern] [--tool-prefix P] --stdio -- CMD ARGS...

Era selection (`mcp.Client(mode=...)`):
  default   mode="auto": probe `server/discover` at 2026-07-28, fall back to `initialize` on any error
  --legacy  mode="legacy": always the initialize handshake (no probe)
  --modern  mode="auto", but fail unless the negotiated era is 2026-07-28

Runs a fixed scenario and prints ONE JSON object on stdout:
  {"ok": true, "era": "modern"|"legacy", "protocol_version": ..., "server_name": ..., "tools": [...sorted],
   "echo": ..., "add": ..., "progress_result": ..., "progress_events": N, "resource": ..., "prompt": ...}
With --scenario input: the client declares elicitation, sampling and roots (callbacks answer
`{name: "octocat"}`, "Paris" and the root file:///work), calls the `ask` and `roots` tools and prints
  {"ok": true, "era": ..., "ask": ..., "roots": ..., "asked": {"elicitation": N, "sampling": N, "roots": N}}
On failure: {"ok": false, "error": "..."} and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url")
    p.add_argument("--stdio", action="store_true", help="launch the command after `--` and talk over stdio")
    era = p.add_mutually_exclusive_group()
    era.add_argument("--legacy", action="store_true")
    era.add_argument("--modern", action="store_true")
    p.add_argument("--header", action="append", default=[], help="extra HTTP header 'K: V' (repeatable)")
    p.add_argument("--sse", action="store_true", help="the 2024-11-05 HTTP+SSE transport (--url is the GET stream)")
    p.add_argument("--tool-prefix", default="")
    p.add_argument("--scenario", choices=["basic", "input"], default="basic")
    p.add_argument("--timeout", type=float, default=20.0, help="overall deadline in seconds")
    args = p.parse_args(argv)
    if args.stdio == bool(args.url):
        p.error("exactly one of --url or --stdio -- CMD ... is required")
    if args.stdio and not cmd:
        p.error("--stdio needs a command after --")
    return args, cmd


def text_of(content: list[Any]) -> str:
    return "".join(getattr(c, "text", "") for c in content)


async def scenario(args: argparse.Namespace, cmd: list[str]) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for h in args.header:
        k, sep, v = h.partition(":")
        if not sep:
            raise ValueError(f"bad --header {h!r}, expected 'K: V'")
        headers[k.strip()] = v.strip()

    async with AsyncExitStack() as stack:
        if args.stdio:
            server: Any = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
        elif args.sse:
            server = sse_client(args.url, headers=headers or None)
        else:
            http = await stack.enter_async_context(create_mcp_http_client(headers=headers or None))
            server = streamable_http_client(args.url, http_client=http)

        asked = {"elicitation": 0, "sampling": 0, "roots": 0}

        async def on_elicit(context: Any, params: Any) -> mcp_types.ElicitResult:
            asked["elicitation"] += 1
            return mcp_types.ElicitResult(action="accept", content={"name": "octocat"})

        async def on_sample(context: Any, params: Any) -> mcp_types.CreateMessageResult:
            asked["sampling"] += 1
            return mcp_types.CreateMessageResult(
                role="assistant",
                content=mcp_types.TextContent(type="text", text="Paris"),
                model="m",
                stop_reason="endTurn",
            )

        async def on_roots(context: Any) -> mcp_types.ListRootsResult:
            asked["roots"] += 1
            return mcp_types.ListRootsResult(roots=[mcp_types.Root(uri="file:///work", name="work")])

        callbacks: dict[str, Any] = {}
        if args.scenario == "input":
            callbacks = {
                "elicitation_callback": on_elicit,
                "sampling_callback": on_sample,
                "list_roots_callback": on_roots,
            }
        client = Client(
            server,
            mode="legacy" if args.legacy or args.sse else "auto",
            read_timeout_seconds=args.timeout,
            cache=None,  # every call must reach the server
            **callbacks,
        )
        async with client:
            version = client.protocol_version
            era = "modern" if version in MODERN_PROTOCOL_VERSIONS else "legacy"
            if args.modern and era != "modern":
                raise RuntimeError(f"expected the 2026-07-28 era, negotiated {version}")
            info = client.server_info
            pre = args.tool_prefix
            if args.scenario == "input":
                ask = await client.call_tool(pre + "ask", {})
                roots = await client.call_tool(pre + "roots", {})
                for name, r in (("ask", ask), ("roots", roots)):
                    if r.is_error:
                        raise RuntimeError(f"tool {name} returned isError: {text_of(r.content)}")
                return {
                    "ok": True,
                    "era": era,
                    "ask": text_of(ask.content),
                    "roots": text_of(roots.content),
                    "asked": asked,
                }

            tools = await client.list_tools()
            echo = await client.call_tool(pre + "echo", {"text": "hi"})
            add = await client.call_tool(pre + "add", {"a": 2, "b": 3})

            events: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                events.append((progress, total, message))

            prog = await client.call_tool(pre + "progress", {"steps": 3}, progress_callback=on_progress)
            res = await client.read_resource("demo://greeting")
            prompt = await client.get_prompt("greet", {"name": "Ada"})

            for name, r in (("echo", echo), ("add", add), ("progress", prog)):
                if r.is_error:
                    raise RuntimeError(f"tool {name} returned isError: {text_of(r.content)}")

            prompt_text = ""
            if prompt.messages:
                prompt_text = getattr(prompt.messages[0].content, "text", "")

            return {
                "ok": True,
                "era": era,
                "protocol_version": version,
                "server_name": info.name if info is not None else None,
                "tools": sorted(t.name for t in tools.tools),
                "echo": text_of(echo.content),
                "add": text_of(add.content),
                "progress_result": text_of(prog.content),
                "progress_events": len(events),
                "resource": "".join(getattr(c, "text", "") for c in res.contents),
                "prompt": prompt_text,
            }


async def amain(args: argparse.Namespace, cmd: list[str]) -> dict[str, Any]:
    with anyio.fail_after(args.timeout):
        return await scenario(args, cmd)


def describe(exc: BaseException) -> str:
    # Unwrap exception groups from anyio task groups to the first leaf.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def main() -> int:
    args, cmd = parse_args(sys.argv[1:])
    try:
        out = anyio.run(amain, args, cmd)
    except BaseException as exc:  # noqa: BLE001 - report everything as JSON
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(json.dumps({"ok": False, "error": describe(exc)}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
