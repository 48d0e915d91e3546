// Interop fixture: an MCP server built on the official TypeScript SDK v1 (@modelcontextprotocol/sdk 1.32.2).
// Entry point is ../ts_server.mjs (this file lives next to node_modules so bare imports resolve).
//
//   --transport http|stdio|sse   default http; HTTP serves POST/GET/DELETE /mcp and GET /stats;
//                            sse is the 2024-11-05 HTTP+SSE transport (SSEServerTransport): GET /sse opens
//                            a session (its `endpoint` event names POST /messages?sessionId=...); /stats
//                            then also reports `sse: {opened, open}` sessions; the `hangup` tool ends its
//                            own session's stream mid-call (never answers)
//   --json                   enableJsonResponse: true (JSON bodies instead of SSE; progress is then dropped)
//   --stateless              sessionIdGenerator: undefined, a fresh server+transport per request
//   --host H                 bind address (default 127.0.0.1)
//   --port P                 port (default 0: picked by the OS; a fixed one lets a test restart the server in place)
//   --ttl-ms N, --cache-scope S   accepted and ignored (the v1 SDK is initialize-era only)
//   --input-tools            also register `ask` and `roots` (server-to-client requests mid-call)
//
// HTTP prints exactly one line `LISTENING <port>` on stdout once listening. Logs go to stderr.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';
import {
  isInitializeRequest, ElicitResultSchema, CreateMessageResultSchema, ListRootsResultSchema,
  SubscribeRequestSchema, UnsubscribeRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

const { values: opts } = parseArgs({
  options: {
    transport: { type: 'string', default: 'http' },
    json: { type: 'boolean', default: false },
    stateless: { type: 'boolean', default: false },
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '0' },
    'ttl-ms': { type: 'string' },
    'cache-scope': { type: 'string' },
    'input-tools': { type: 'boolean', default: false },
  },
  strict: true,
});

const log = (...a) => console.error('ts_server:', ...a);
// McpServer.sendToolListChanged() fires and forgets; never let a failed send kill the fixture.
process.on('unhandledRejection', (e) => log('unhandled rejection:', e?.message ?? e));

// ---- counters for GET /stats ----
// requests/notifications: JSON-RPC messages by method as they arrive in POST bodies on /mcp (counted
// before the SDK validates headers/sessions); dispatched: requests the transport handed to the
// McpServer; http: raw hits on /mcp by HTTP method.
// slow: outcomes of the `slow` tool (cancelled = the SDK aborted the handler's signal).
const stats = { requests: {}, notifications: {}, dispatched: {}, http: {}, slow: { started: 0, completed: 0, cancelled: 0 }, sse: { opened: 0, open: 0 } };
const bump = (m, k) => { m[k] = (m[k] || 0) + 1; };
function countMessage(msg) {
  if (!msg || typeof msg !== 'object' || typeof msg.method !== 'string') return;
  if (msg.id === undefined) bump(stats.notifications, msg.method);
  else bump(stats.requests, msg.method);
}

// ---- the MCP server (one McpServer per session/request, as the SDK examples do) ----
const dynamicTools = [];          // names added via add_tool, registered on every server
const liveServers = new Set();    // connected McpServer instances

const text = (t) => ({ content: [{ type: 'text', text: String(t) }] });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function registerDynamic(server, name) {
  server.registerTool(name, { description: `dynamic echo tool ${name}`, inputSchema: { text: z.string().optional() } },
    async ({ text: t }) => text(t ?? ''));
}

function registerInputTools(server) {
  // Server-to-client requests mid-call, on the call's own stream (`extra.sendRequest` carries the
  // related request id): `ask` elicits a name, then samples the client's LLM; `roots` lists the
  // client's roots.
  server.registerTool('ask', { description: 'Elicit a name, then sample the client, then report both', inputSchema: {} },
    async (_args, extra) => {
      const e = await extra.sendRequest({
        method: 'elicitation/create',
        params: { mode: 'form', message: 'name?', requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] } },
      }, ElicitResultSchema);
      const s = await extra.sendRequest({
        method: 'sampling/createMessage',
        params: { messages: [{ role: 'user', content: { type: 'text', text: 'capital of France?' } }], maxTokens: 10 },
      }, CreateMessageResultSchema);
      return text(`name=${e.content?.name}; sampled=${s.content?.text}`);
    });

  server.registerTool('roots', { description: "List the client's roots", inputSchema: {} },
    async (_args, extra) => {
      const r = await extra.sendRequest({ method: 'roots/list' }, ListRootsResultSchema);
      return text(r.roots.map((x) => x.uri).join(','));
    });
}

function buildServer() {
  const server = new McpServer(
    { name: 'portico-interop-typescript', version: '1.0.0' },
    { instructions: 'portico interop fixture (typescript)', capabilities: { resources: { subscribe: true }, logging: {} } },
  );
  // resources/subscribe: the URIs this server's (= this session's) client subscribed to.
  server.subscribed = new Set();
  server.server.setRequestHandler(SubscribeRequestSchema, async (req) => { server.subscribed.add(req.params.uri); return {}; });
  server.server.setRequestHandler(UnsubscribeRequestSchema, async (req) => { server.subscribed.delete(req.params.uri); return {}; });

  server.registerTool('echo', { description: 'Echo the text back', inputSchema: { text: z.string() } },
    async ({ text: t }) => text(t));

  server.registerTool('add', { description: 'Add two integers', inputSchema: { a: z.number().int(), b: z.number().int() } },
    async ({ a, b }) => text(a + b));

  server.registerTool('progress', {
    description: 'Send `steps` progress notifications, then return',
    inputSchema: { steps: z.number().int() },
  }, async ({ steps }, extra) => {
    const token = extra._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      if (token !== undefined) {
        await extra.sendNotification({
          method: 'notifications/progress',
          params: { progressToken: token, progress: i, total: steps, message: `step ${i}/${steps}` },
        });
      }
      await sleep(50);
    }
    return text(`done ${steps}`);
  });

  server.registerTool('slow', { description: 'Sleep `ms` milliseconds', inputSchema: { ms: z.number().int() } },
    async ({ ms }, extra) => {
      stats.slow.started += 1;
      const aborted = await new Promise((resolve) => {
        const t = setTimeout(() => resolve(false), ms);
        extra.signal?.addEventListener('abort', () => { clearTimeout(t); resolve(true); });
      });
      stats.slow[aborted ? 'cancelled' : 'completed'] += 1;
      return text(aborted ? `cancelled ${ms}` : `slept ${ms}`);
    });

  server.registerTool('add_tool', {
    description: 'Register a new echo-like tool and announce tools/list_changed',
    inputSchema: { name: z.string() },
  }, async ({ name }) => {
    if (!dynamicTools.includes(name)) {
      dynamicTools.push(name);
      // registerTool on a connected server sends notifications/tools/list_changed itself
      // (on the session's standalone GET stream over HTTP; dropped if none is open).
      for (const s of liveServers) {
        try { registerDynamic(s, name); } catch (e) { log('registerTool failed', e?.message); }
      }
    }
    return text(`added ${name}`);
  });

  server.registerTool('touch', {
    description: 'Announce notifications/resources/updated for `uri` to every session subscribed to it',
    inputSchema: { uri: z.string() },
  }, async ({ uri }) => {
    let n = 0;
    for (const s of liveServers) {
      if (s.subscribed?.has(uri)) {
        n += 1;
        try { await s.server.sendResourceUpdated({ uri }); } catch (e) { log('sendResourceUpdated failed', e?.message); }
      }
    }
    return text(`touched ${uri} for ${n}`);
  });

  server.registerTool('log', {
    description: 'Log `<tag>:<level>` at debug, info, warning and error on this request, as far as the session level (logging/setLevel) lets through',
    inputSchema: { tag: z.string() },
  }, async ({ tag }, extra) => {
    for (const level of ['debug', 'info', 'warning', 'error']) {
      if (server.server.isMessageIgnored(level, extra.sessionId)) continue;
      await extra.sendNotification({ method: 'notifications/message', params: { level, data: `${tag}:${level}` } });
    }
    return text('logged');
  });

  server.registerTool('whoami', { description: "Return the Authorization header this server saw, or 'none'", inputSchema: {} },
    async (_args, extra) => text(extra.requestInfo?.headers?.authorization ?? 'none'));

  if (opts['input-tools']) registerInputTools(server);

  // SSE mode: ends the caller's own session stream mid-call and never answers.
  if (opts.transport === 'sse') server.registerTool('hangup', { description: "End this session's SSE stream mid-call", inputSchema: {} },
    async (_args, extra) => {
      const t = sseTransports.get(extra.sessionId);
      setTimeout(() => t?.close().catch(() => {}), 50);
      await sleep(60000);
      return text('still here');
    });

  server.registerResource('greeting', 'demo://greeting', { mimeType: 'text/plain', description: 'A greeting' },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: 'text/plain', text: 'hello from typescript' }] }));

  server.registerPrompt('greet', { description: 'Greet someone', argsSchema: { name: z.string() } },
    async ({ name }) => ({ messages: [{ role: 'user', content: { type: 'text', text: `Hello, ${name}!` } }] }));

  for (const name of dynamicTools) registerDynamic(server, name);
  return server;
}

async function connect(server, transport) {
  liveServers.add(server);
  const prevClose = transport.onclose;
  await server.connect(transport);
  const sdkMessage = transport.onmessage;
  transport.onmessage = (msg, extra) => {
    if (msg && typeof msg.method === 'string' && msg.id !== undefined) bump(stats.dispatched, msg.method);
    sdkMessage?.(msg, extra);
  };
  const sdkClose = transport.onclose;
  transport.onclose = () => { liveServers.delete(server); sdkClose?.(); prevClose?.(); };
}

// ---- stdio ----
async function runStdio() {
  const server = buildServer();
  const transport = new StdioServerTransport();
  await connect(server, transport);
  log('serving on stdio');
}

// ---- Streamable HTTP ----
function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJson(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
  res.end(data);
}

const transports = new Map(); // sessionId -> transport (stateful mode)

function newTransport(extra = {}) {
  return new StreamableHTTPServerTransport({ enableJsonResponse: opts.json, ...extra });
}

async function handleMcp(req, res) {
  bump(stats.http, req.method);
  let body;
  if (req.method === 'POST') {
    const raw = await readBody(req);
    try {
      body = JSON.parse(raw);
    } catch {
      sendJson(res, 400, { jsonrpc: '2.0', error: { code: -32700, message: 'Parse error: Invalid JSON' }, id: null });
      return;
    }
    for (const m of Array.isArray(body) ? body : [body]) countMessage(m);
  }

  if (opts.stateless) {
    const server = buildServer();
    const transport = newTransport({ sessionIdGenerator: undefined });
    res.on('close', () => { transport.close(); server.close(); liveServers.delete(server); });
    await connect(server, transport);
    await transport.handleRequest(req, res, body);
    return;
  }

  const sid = req.headers['mcp-session-id'];
  let transport = sid ? transports.get(sid) : undefined;
  if (!transport) {
    if (!sid && req.method === 'POST' && !Array.isArray(body) && isInitializeRequest(body)) {
      transport = newTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => { transports.set(id, transport); },
      });
      const server = buildServer();
      const sdkCloseHook = () => { if (transport.sessionId) transports.delete(transport.sessionId); };
      await connect(server, transport);
      const onclose = transport.onclose;
      transport.onclose = () => { sdkCloseHook(); onclose?.(); };
    } else if (sid) {
      sendJson(res, 404, { jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null });
      return;
    } else {
      sendJson(res, 400, { jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null });
      return;
    }
  }
  await transport.handleRequest(req, res, body);
}

async function runHttp() {
  const httpServer = http.createServer(async (req, res) => {
    try {
      const path = new URL(req.url, 'http://x').pathname;
      if (path === '/stats' && req.method === 'GET') return sendJson(res, 200, stats);
      if (path === '/mcp' || path === '/mcp/') return await handleMcp(req, res);
      sendJson(res, 404, { error: 'not found' });
    } catch (e) {
      log('request failed:', e?.stack || e);
      if (!res.headersSent) sendJson(res, 500, { jsonrpc: '2.0', error: { code: -32603, message: 'Internal server error' }, id: null });
    }
  });
  httpServer.listen(Number(opts.port), opts.host, () => {
    process.stdout.write(`LISTENING ${httpServer.address().port}\n`);
    log(`listening on ${opts.host}:${httpServer.address().port} (json=${opts.json} stateless=${opts.stateless})`);
  });
  const shutdown = () => {
    for (const t of transports.values()) t.close().catch(() => {});
    httpServer.closeAllConnections?.();
    httpServer.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 500).unref();
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);
}

// ---- 2024-11-05 HTTP+SSE ----
const sseTransports = new Map(); // sessionId -> SSEServerTransport

async function runSse() {
  const httpServer = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://x');
      if (url.pathname === '/stats' && req.method === 'GET') return sendJson(res, 200, stats);
      if (url.pathname === '/sse' && req.method === 'GET') {
        bump(stats.http, 'GET');
        const transport = new SSEServerTransport('/messages', res);
        sseTransports.set(transport.sessionId, transport);
        stats.sse.opened += 1;
        stats.sse.open += 1;
        let closed = false;
        const gone = () => {
          if (closed) return;
          closed = true;
          sseTransports.delete(transport.sessionId);
          stats.sse.open -= 1;
        };
        res.on('close', gone);
        const server = buildServer();
        await connect(server, transport);
        const onclose = transport.onclose;
        transport.onclose = () => { gone(); onclose?.(); };
        return;
      }
      if (url.pathname === '/messages' && req.method === 'POST') {
        bump(stats.http, 'POST');
        const raw = await readBody(req);
        let body;
        try { body = JSON.parse(raw); } catch { return sendJson(res, 400, { error: 'bad json' }); }
        countMessage(body);
        const t = sseTransports.get(url.searchParams.get('sessionId'));
        if (!t) return sendJson(res, 404, { error: 'Session not found' });
        return await t.handlePostMessage(req, res, body);
      }
      sendJson(res, 404, { error: 'not found' });
    } catch (e) {
      log('request failed:', e?.stack || e);
      if (!res.headersSent) sendJson(res, 500, { error: 'internal' });
    }
  });
  httpServer.listen(Number(opts.port), opts.host, () => {
    process.stdout.write(`LISTENING ${httpServer.address().port}\n`);
    log(`listening (sse) on ${opts.host}:${httpServer.address().port}`);
  });
  const shutdown = () => {
    for (const t of sseTransports.values()) t.close().catch(() => {});
    httpServer.closeAllConnections?.();
    httpServer.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 500).unref();
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);
}

if (opts.transport === 'stdio') await runStdio();
else if (opts.transport === 'sse') await runSse();
else if (opts.transport === 'http') await runHttp();
else { log(`unknown --transport ${opts.transport}`); process.exit(2); }
