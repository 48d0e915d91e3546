#!/usr/bin/env node
// TypeScript SDK v1 MCP server fixture. The code lives in node/ts_server.mjs, next to
// node/node_modules, so that its bare '@modelcontextprotocol/sdk' imports resolve.
// Flags: --transport http|stdio  --json  --stateless  --host H  (see README.md)
import './node/ts_server.mjs';
