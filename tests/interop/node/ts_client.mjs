// Interop fixture: an MCP client built on the official TypeScript SDK v1 (@modelcontextprotocol/sdk 1.32.2).
// Entry point is ../ts_client.mjs. The v1 SDK speaks only the initialize era (era is always "legacy").
//
//   ts_client.mjs --url http://127.0.0.1:PORT/mcp [--header 'K: V']... [--tool-prefix P] [--timeout S]
//   ts_client.mjs [--tool-prefix P] --stdio -- CMD ARGS...
//   (--legacy is accepted and ignored.)
//   --sse: the 2024-11-05 HTTP+SSE transport (SSEClientTransport; --url is the GET stream's URL).
//   ts_client.mjs --url URL --scenario notes --uri U --level L --tag T
//     resources/subscribe U, logging/setLevel L, then tools `touch {uri: U}` and `log {tag: T}`;
//     reports the notifications/resources/updated URIs and the log lines (`data`) it received,
//     on any stream, and the server's advertised capabilities.
//
//   --scenario input         declare elicitation, sampling and roots (handlers answer {name: "octocat"},
//                            "Paris" and the root file:///work), call `ask` and `roots`; prints
//                            {"ok": true, "era": "legacy", "ask": ..., "roots": ..., "asked": {...}}
//
// Prints ONE JSON object on stdout (same shape as py_client.py); {"ok": false, "error": ...} + exit 1 on failure.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { LoggingMessageNotificationSchema, ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { parseArgs } from 'node:util';
import { ElicitRequestSchema, CreateMessageRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

function fail(msg) {
  process.stdout.write(JSON.stringify({ ok: false, error: String(msg) }) + '\n');
  process.exit(1);
}

const argv = process.argv.slice(2);
const dd = argv.indexOf('--');
const own = dd >= 0 ? argv.slice(0, dd) : argv;
const cmd = dd >= 0 ? argv.slice(dd + 1) : [];
let opts;
try {
  ({ values: opts } = parseArgs({
    args: own,
    options: {
      url: { type: 'string' },
      stdio: { type: 'boolean', default: false },
      legacy: { type: 'boolean', default: false },
      sse: { type: 'boolean', default: false },
      header: { type: 'string', multiple: true, default: [] },
      'tool-prefix': { type: 'string', default: '' },
      timeout: { type: 'string', default: '20' },
      scenario: { type: 'string', default: 'basic' },
      uri: { type: 'string', default: 'demo://greeting' },
      level: { type: 'string', default: 'info' },
      tag: { type: 'string', default: 'T' },
    },
    strict: true,
  }));
} catch (e) {
  fail(`bad arguments: ${e.message}`);
}
if (!!opts.url === opts.stdio) fail('exactly one of --url or --stdio -- CMD ... is required');
if (opts.stdio && cmd.length === 0) fail('--stdio needs a command after --');

const timeoutMs = Math.round(Number(opts.timeout) * 1000);
const pre = opts['tool-prefix'];
const textOf = (content) => (content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

async function scenario() {
  let transport;
  if (opts.stdio) {
    transport = new StdioClientTransport({ command: cmd[0], args: cmd.slice(1), env: { ...process.env }, stderr: 'inherit' });
  } else {
    const headers = {};
    for (const h of opts.header) {
      const i = h.indexOf(':');
      if (i < 0) throw new Error(`bad --header ${JSON.stringify(h)}, expected 'K: V'`);
      headers[h.slice(0, i).trim()] = h.slice(i + 1).trim();
    }
    transport = opts.sse
      ? new SSEClientTransport(new URL(opts.url), { requestInit: { headers } })
      : new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers } });
  }
  const input = opts.scenario === 'input';
  const capabilities = input ? { elicitation: { form: {} }, sampling: {}, roots: {} } : {};
  const client = new Client({ name: 'portico-interop-ts-client', version: '1.0.0' }, { capabilities });
  const asked = { elicitation: 0, sampling: 0, roots: 0 };
  if (input) {
    client.setRequestHandler(ElicitRequestSchema, async () => {
      asked.elicitation += 1;
      return { action: 'accept', content: { name: 'octocat' } };
    });
    client.setRequestHandler(CreateMessageRequestSchema, async () => {
      asked.sampling += 1;
      return { role: 'assistant', content: { type: 'text', text: 'Paris' }, model: 'm', stopReason: 'endTurn' };
    });
    client.setRequestHandler(ListRootsRequestSchema, async () => {
      asked.roots += 1;
      return { roots: [{ uri: 'file:///work', name: 'work' }] };
    });
  }
  const ro = { timeout: timeoutMs };
  const updated = [];
  const logs = [];
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => { updated.push(n.params.uri); });
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { logs.push(String(n.params.data)); });
  await client.connect(transport, ro);
  try {
    if (input) {
      const ask = await client.callTool({ name: pre + 'ask', arguments: {} }, undefined, ro);
      const roots = await client.callTool({ name: pre + 'roots', arguments: {} }, undefined, ro);
      for (const [n, r] of [['ask', ask], ['roots', roots]]) {
        if (r.isError) throw new Error(`tool ${n} returned isError: ${textOf(r.content)}`);
      }
      return { ok: true, era: 'legacy', ask: textOf(ask.content), roots: textOf(roots.content), asked };
    }
    if (opts.scenario === 'notes') return await notes(client, transport, ro, updated, logs);
    const info = client.getServerVersion();
    const tools = await client.listTools({}, ro);
    const echo = await client.callTool({ name: pre + 'echo', arguments: { text: 'hi' } }, undefined, ro);
    const add = await client.callTool({ name: pre + 'add', arguments: { a: 2, b: 3 } }, undefined, ro);
    let events = 0;
    const prog = await client.callTool({ name: pre + 'progress', arguments: { steps: 3 } }, undefined,
      { ...ro, onprogress: () => { events += 1; } });
    const res = await client.readResource({ uri: 'demo://greeting' }, ro);
    const prompt = await client.getPrompt({ name: 'greet', arguments: { name: 'Ada' } }, ro);
    for (const [n, r] of [['echo', echo], ['add', add], ['progress', prog]]) {
      if (r.isError) throw new Error(`tool ${n} returned isError: ${textOf(r.content)}`);
    }
    return {
      ok: true,
      era: 'legacy',
      protocol_version: transport.protocolVersion ?? null,
      server_name: info?.name ?? null,
      tools: tools.tools.map((t) => t.name).sort(),
      echo: textOf(echo.content),
      add: textOf(add.content),
      progress_result: textOf(prog.content),
      progress_events: events,
      resource: res.contents.map((c) => c.text ?? '').join(''),
      prompt: prompt.messages?.[0]?.content?.text ?? '',
    };
  } finally {
    if (!opts.stdio && transport.sessionId) {
      await transport.terminateSession().catch(() => {});
    }
    await client.close().catch(() => {});
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The notifications scenario (see the header). The GET stream opens in the background after
// `initialized`: the update is retried until it arrives on it (bounded by --timeout).
async function notes(client, transport, ro, updated, logs) {
  const caps = client.getServerCapabilities() ?? {};
  await client.subscribeResource({ uri: opts.uri }, ro);
  await client.setLoggingLevel(opts.level, ro);
  let touches = 0;
  while (updated.length === 0) {
    await client.callTool({ name: 'touch', arguments: { uri: opts.uri } }, undefined, ro);
    touches += 1;
    for (let i = 0; i < 20 && updated.length === 0; i++) await sleep(50);
  }
  const logged = await client.callTool({ name: 'log', arguments: { tag: opts.tag } }, undefined, ro);
  if (logged.isError) throw new Error(`log returned isError: ${textOf(logged.content)}`);
  await sleep(300); // anything late (a line meant for someone else would show up here)
  await client.unsubscribeResource({ uri: opts.uri }, ro);
  return { ok: true, capabilities: caps, updated: [...new Set(updated)], touches, logs, session: transport.sessionId ?? null };
}

const deadline = new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out after ${opts.timeout}s`)), timeoutMs).unref());
try {
  const out = await Promise.race([scenario(), deadline]);
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
} catch (e) {
  fail(e?.message ?? e);
}
