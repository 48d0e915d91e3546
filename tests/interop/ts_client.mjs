#!/usr/bin/env node
// TypeScript SDK v1 MCP client fixture. The code lives in node/ts_client.mjs, next to
// node/node_modules, so that its bare '@modelcontextprotocol/sdk' imports resolve.
// Usage: ts_client.mjs --url URL [--header 'K: V']... [--tool-prefix P] | --stdio -- CMD ARGS...
import './node/ts_client.mjs';
