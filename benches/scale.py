#!/usr/bin/env python3
"""Client side of benches/scale.sh: many initialize-era sessions, listen streams or idle connections.

Standard library only (asyncio with a minimal HTTP/1.1 client: keep-alive, Content-Length and
chunked bodies, SSE). Three modes, all driven by files so the shell can measure while the client
holds what it opened:

  scale.py sessions --port P --path /mcp/bench --n 10000 [--call] --ready R --release X
      Opens N initialize-era sessions (initialize -> Mcp-Session-Id -> notifications/initialized,
      and with --call one tools/call each), at most --concurrency at a time, each worker on one
      keep-alive connection, closed once every session is open. Writes a JSON summary to R,
      waits until X exists (holding the session ids), then sends one tools/call on a sample of the sessions (fresh connections) and
      prints the final JSON on stdout.

  scale.py streams --port P --path /mcp/bench --n 1000 --window 10 --ready R --release X
      Opens N 2026-07-28 subscriptions/listen streams (one connection each; at most
      --concurrency waiting for their acknowledgement at a time), counts the notifications arriving
      on all of them for --window seconds, writes the JSON summary to R, keeps counting until X
      exists, then prints the final JSON (including the rate while the shell's load ran).

  scale.py conns --port P --path /mcp/bench --n 5000 --batches 5 --idle 3 --ready R --release X
      Opens N keep-alive connections, one 2026-07-28 tools/call on each (at most --concurrency
      at a time), in --batches batches each followed by --idle seconds of idling (the last
      batch's too), writes the JSON summary to R, waits
      until X exists, then sends a second tools/call on a sample of the same connections (do
      they still serve?), closes them all and prints the final JSON.

Every wait is bounded (--timeout per request, --hold-timeout for the release file).
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import time

LATEST = "2026-07-28"
LEGACY = "2025-06-18"
META = {
    "io.modelcontextprotocol/protocolVersion": LATEST,
    "io.modelcontextprotocol/clientCapabilities": {},
}
SUB_ID = "io.modelcontextprotocol/subscriptionId"


class HttpError(Exception):
    pass


class Conn:
    """One HTTP/1.1 keep-alive connection."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.r = self.w = None

    async def connect(self):
        self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        sock = self.w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    def _encode(self, method, path, headers, body):
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def send_head(self, method, path, headers, body):
        """Sends a request and reads the response head: (status, lower-cased headers)."""
        if self.w is None:
            await self.connect()
        self.w.write(self._encode(method, path, headers, body))
        await self.w.drain()
        while True:
            head = await self.r.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise HttpError(f"bad status line {lines[0]!r}")
            status = int(parts[1])
            hdrs = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    hdrs[k.strip().lower()] = v.strip()
            if 100 <= status < 200:
                continue  # 100 Continue and friends: the real answer follows
            return status, hdrs

    async def chunks(self, status, hdrs):
        """The response body as it arrives (de-chunked)."""
        if status in (204, 304):
            return
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            while True:
                line = await self.r.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await self.r.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    return
                data = await self.r.readexactly(size)
                await self.r.readexactly(2)
                yield data
        elif "content-length" in hdrs:
            n = int(hdrs["content-length"])
            if n:
                yield await self.r.readexactly(n)
        else:
            while True:
                data = await self.r.read(65536)
                if not data:
                    self.close()
                    return
                yield data

    async def request(self, path, headers, body, retry=True):
        """POST with one retry (unless `retry` is false) on a connection the server closed
        while idle."""
        for attempt in (0, 1) if retry else (1,):
            fresh = self.w is None
            try:
                status, hdrs = await self.send_head("POST", path, headers, body)
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                self.close()
                if fresh or attempt:
                    raise
                continue
            data = b"".join([c async for c in self.chunks(status, hdrs)])
            if hdrs.get("connection", "").lower() == "close":
                self.close()
            return status, hdrs, data
        raise HttpError("unreachable")


class Sse:
    """Incremental SSE decoder: push bytes, pop the data of complete events."""

    def __init__(self):
        self.buf = b""

    def push(self, data):
        self.buf = (self.buf + data).replace(b"\r\n", b"\n")
        out = []
        while b"\n\n" in self.buf:
            ev, self.buf = self.buf.split(b"\n\n", 1)
            payload = [ln[5:].lstrip(b" ") for ln in ev.split(b"\n") if ln.startswith(b"data:")]
            if payload:
                out.append(b"\n".join(payload))
        return out


def message(hdrs, data):
    """The JSON-RPC message of an answer (JSON, or the last event of an SSE answer)."""
    if hdrs.get("content-type", "").startswith("text/event-stream"):
        events = Sse().push(data + b"\n\n")
        if not events:
            raise HttpError("SSE answer without an event")
        data = events[-1]
    return json.loads(data)


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


async def wait_release(path, timeout):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.1)
    return True


# ------------------------------------------------------------------------------ sessions


def legacy_headers(sid=None):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if sid:
        h["Mcp-Session-Id"] = sid
        h["MCP-Protocol-Version"] = LEGACY
    return h


def call_body(rid):
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "echo", "arguments": {"text": "hello"}}}).encode()


async def call_ok(conn, path, sid, rid, timeout):
    status, hdrs, data = await asyncio.wait_for(
        conn.request(path, legacy_headers(sid), call_body(rid)), timeout)
    if status != 200:
        raise HttpError(f"tools/call: HTTP {status}")
    msg = message(hdrs, data)
    text = (msg.get("result") or {}).get("content", [{}])[0].get("text")
    if msg.get("id") != rid or not isinstance(text, str):
        raise HttpError(f"tools/call: no result: {str(msg)[:120]}")


async def open_session(conn, a, i):
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "scale-client", "version": str(i)}}}).encode()
    status, hdrs, data = await asyncio.wait_for(
        conn.request(a.path, legacy_headers(), init), a.timeout)
    if status != 200:
        raise HttpError(f"initialize: HTTP {status}")
    sid = hdrs.get("mcp-session-id")
    if not sid:
        raise HttpError("initialize: no Mcp-Session-Id")
    if message(hdrs, data).get("result", {}).get("protocolVersion") != LEGACY:
        raise HttpError("initialize: unexpected result")
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    status, _, _ = await asyncio.wait_for(conn.request(a.path, legacy_headers(sid), note), a.timeout)
    if status not in (200, 202):
        raise HttpError(f"notifications/initialized: HTTP {status}")
    if a.call:
        await call_ok(conn, a.path, sid, 1, a.timeout)
    return sid


def reason(e):
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    return f"{type(e).__name__}: {e}"[:100]


async def sessions(a):
    sids, times, errors = [], [], {}
    next_i = 0
    conns = []

    async def worker():
        nonlocal next_i
        conn = Conn(a.host, a.port)
        conns.append(conn)
        while next_i < a.n:
            i = next_i
            next_i += 1
            t0 = time.monotonic()
            try:
                sids.append(await open_session(conn, a, i))
                times.append(time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 - every failure is counted by reason
                errors[reason(e)] = errors.get(reason(e), 0) + 1
                conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(min(a.concurrency, a.n))))
    took = time.monotonic() - t0
    # A session is its id, not a connection: what stays in portico is what the sessions cost.
    for c in conns:
        c.close()
    summary = {
        "requested": a.n, "opened": len(sids), "failed": a.n - len(sids), "errors": errors,
        "seconds": round(took, 3), "per_s": round(len(sids) / took, 1) if took > 0 else None,
        "open_p50_ms": round(pct(times, 50) * 1000, 2) if times else None,
        "open_p99_ms": round(pct(times, 99) * 1000, 2) if times else None,
        "requests_per_session": 3 if a.call else 2, "concurrency": min(a.concurrency, a.n),
    }
    write_json(a.ready, summary)
    summary["released"] = await wait_release(a.release, a.hold_timeout)
    # Are the sessions still good after the hold? One tools/call on a sample, fresh connections.
    sample = sids[:: max(1, len(sids) // a.verify)][: a.verify] if sids else []
    ok, verrs = 0, {}
    conn = Conn(a.host, a.port)
    for k, sid in enumerate(sample):
        try:
            await call_ok(conn, a.path, sid, 100 + k, a.timeout)
            ok += 1
        except Exception as e:  # noqa: BLE001
            verrs[reason(e)] = verrs.get(reason(e), 0) + 1
            conn.close()
    conn.close()
    summary.update({"verified": ok, "verify_sample": len(sample), "verify_errors": verrs})
    return summary


# ------------------------------------------------------------------------------ streams


class Streams:
    def __init__(self):
        self.notes = 0          # notifications received on all streams (acknowledgements excluded)
        self.bad_sid = 0        # notifications whose subscriptionId is not the stream's id
        self.ended = 0          # streams that ended (EOF, error) after their acknowledgement
        self.end_reasons = {}
        self.tasks = []
        self.conns = []


def listen_body(sid):
    return json.dumps({"jsonrpc": "2.0", "id": sid, "method": "subscriptions/listen", "params": {
        "notifications": {"toolsListChanged": True}, "_meta": META}}).encode()


LISTEN_HEADERS = {
    "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": LATEST, "Mcp-Method": "subscriptions/listen",
}


async def open_stream(a, st, i):
    """Opens stream i and returns once it is acknowledged; a task then reads it."""
    sid = f"L{i}"
    conn = Conn(a.host, a.port)
    status, hdrs = await asyncio.wait_for(
        conn.send_head("POST", a.path, LISTEN_HEADERS, listen_body(sid)), a.timeout)
    if status != 200 or not hdrs.get("content-type", "").startswith("text/event-stream"):
        data = b"".join([c async for c in conn.chunks(status, hdrs)])[:120]
        conn.close()
        raise HttpError(f"listen: HTTP {status} {hdrs.get('content-type')}: {data!r}")
    body = conn.chunks(status, hdrs).__aiter__()
    dec = Sse()
    pending = []
    acked = False
    end = time.monotonic() + a.timeout
    while not acked:
        left = end - time.monotonic()
        if left <= 0:
            conn.close()
            raise asyncio.TimeoutError()
        try:
            data = await asyncio.wait_for(body.__anext__(), left)
        except StopAsyncIteration:
            conn.close()
            raise HttpError("listen: stream ended before the acknowledgement")
        for ev in dec.push(data):
            msg = json.loads(ev)
            if msg.get("method") == "notifications/subscriptions/acknowledged":
                if msg["params"]["_meta"].get(SUB_ID) != sid:
                    st.bad_sid += 1
                acked = True
            elif acked:
                pending.append(msg)
            else:
                conn.close()
                raise HttpError(f"listen: first message is not the acknowledgement: {str(msg)[:120]}")
    st.conns.append(conn)

    def count(msg):
        if "id" in msg:
            return  # a result: the stream's end
        st.notes += 1
        if (msg.get("params") or {}).get("_meta", {}).get(SUB_ID) != sid:
            st.bad_sid += 1

    for msg in pending:
        count(msg)

    async def read():
        why = "stream ended"
        try:
            async for data in body:
                for ev in dec.push(data):
                    count(json.loads(ev))
        except asyncio.CancelledError:
            return
        except Exception as e:  # noqa: BLE001
            why = reason(e)
        st.ended += 1
        st.end_reasons[why] = st.end_reasons.get(why, 0) + 1

    st.tasks.append(asyncio.create_task(read()))


async def streams(a):
    st = Streams()
    errors = {}
    sem = asyncio.Semaphore(a.concurrency)

    async def one(i):
        async with sem:
            try:
                await open_stream(a, st, i)
            except Exception as e:  # noqa: BLE001
                errors[reason(e)] = errors.get(reason(e), 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(a.n)))
    took = time.monotonic() - t0
    await asyncio.sleep(a.settle)
    c0, t1 = st.notes, time.monotonic()
    await asyncio.sleep(a.window)
    c1, t2 = st.notes, time.monotonic()
    summary = {
        "requested": a.n, "opened": len(st.conns), "failed": a.n - len(st.conns), "errors": errors,
        "open_seconds": round(took, 3), "window_s": round(t2 - t1, 3),
        "notes_per_s": round((c1 - c0) / (t2 - t1), 1), "ended": st.ended,
        "bad_subscription_id": st.bad_sid,
    }
    write_json(a.ready, summary)
    summary["released"] = await wait_release(a.release, a.hold_timeout)
    c3, t3 = st.notes, time.monotonic()
    summary.update({
        "hold_s": round(t3 - t2, 3),
        "hold_notes_per_s": round((c3 - c1) / (t3 - t2), 1) if t3 > t2 else None,
        "ended": st.ended, "end_reasons": st.end_reasons, "bad_subscription_id": st.bad_sid,
        "notes_total": st.notes,
    })
    for t in st.tasks:
        t.cancel()
    for c in st.conns:
        c.close()
    await asyncio.gather(*st.tasks, return_exceptions=True)
    return summary


# ------------------------------------------------------------------------------ idle connections


CALL_HEADERS = {
    "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": LATEST, "Mcp-Method": "tools/call", "Mcp-Name": "echo",
}


async def modern_call(conn, path, rid, timeout, retry=True):
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "hello"}, "_meta": META}}).encode()
    status, hdrs, data = await asyncio.wait_for(
        conn.request(path, CALL_HEADERS, body, retry), timeout)
    if status != 200:
        raise HttpError(f"tools/call: HTTP {status}")
    msg = message(hdrs, data)
    if msg.get("id") != rid or "result" not in msg:
        raise HttpError(f"tools/call: no result: {str(msg)[:120]}")


async def conns(a):
    opened, errors, times = [], {}, []
    sem = asyncio.Semaphore(a.concurrency)

    async def one(i):
        async with sem:
            conn = Conn(a.host, a.port)
            t0 = time.monotonic()
            try:
                await modern_call(conn, a.path, i, a.timeout)
                times.append(time.monotonic() - t0)
                opened.append(conn)
            except Exception as e:  # noqa: BLE001 - every failure is counted by reason
                errors[reason(e)] = errors.get(reason(e), 0) + 1
                conn.close()

    # In batches, each left idle for --idle seconds before the next opens: connections that
    # arrive over time, not all in one burst (what a burst costs at its peak is not what idle
    # connections cost once they have settled).
    took = 0.0
    for b in range(a.batches):
        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(b * a.n // a.batches, (b + 1) * a.n // a.batches)))
        took += time.monotonic() - t0
        await asyncio.sleep(a.idle)
    summary = {
        "requested": a.n, "opened": len(opened), "failed": a.n - len(opened), "errors": errors,
        "open_seconds": round(took, 3), "idle_s": a.idle, "batches": a.batches,
        "call_p50_ms": round(pct(times, 50) * 1000, 2) if times else None,
        "call_p99_ms": round(pct(times, 99) * 1000, 2) if times else None,
    }
    write_json(a.ready, summary)
    summary["released"] = await wait_release(a.release, a.hold_timeout)
    # Do the idle connections still serve? A second call on a sample of them.
    sample = opened[:: max(1, len(opened) // a.verify)][: a.verify] if opened else []
    ok, verrs = 0, {}
    for k, conn in enumerate(sample):
        if conn.w is None:
            verrs["closed before the second call"] = verrs.get("closed before the second call", 0) + 1
            continue
        try:
            await modern_call(conn, a.path, a.n + k, a.timeout, retry=False)
            ok += 1
        except Exception as e:  # noqa: BLE001
            verrs[reason(e)] = verrs.get(reason(e), 0) + 1
    for conn in opened:
        conn.close()
    summary.update({"verified": ok, "verify_sample": len(sample), "verify_errors": verrs})
    return summary


# ------------------------------------------------------------------------------ main


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("mode", choices=["sessions", "streams", "conns"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--call", action="store_true", help="sessions: one tools/call per session")
    p.add_argument("--verify", type=int, default=100,
                   help="sessions, conns: sample re-used after the hold")
    p.add_argument("--idle", type=float, default=3, help="conns: seconds idle after each batch")
    p.add_argument("--batches", type=int, default=1, help="conns: opened in this many batches")
    p.add_argument("--window", type=float, default=10, help="streams: seconds of counting")
    p.add_argument("--settle", type=float, default=2, help="streams: pause before counting")
    p.add_argument("--timeout", type=float, default=30, help="per request / acknowledgement")
    p.add_argument("--ready", required=True)
    p.add_argument("--release", required=True)
    p.add_argument("--hold-timeout", type=float, default=600)
    a = p.parse_args()
    mode = {"sessions": sessions, "streams": streams, "conns": conns}[a.mode]
    result = asyncio.run(mode(a))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
