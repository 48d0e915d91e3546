-- wrk script for benches/run.sh: one fixed 2026-07-28 MCP POST, repeated.
--
--   MCP_METHOD=tools/call MCP_TOOL=echo wrk -t1 -c16 -d5s --latency -s benches/mcp.lua URL
--
-- The request is built once (wrk.body/wrk.headers), so wrk formats it a single time and the Lua
-- VM is not on the per-request path. done() prints one machine-readable line:
--   BENCHJSON {"requests":..,"rps":..,"p50_us":..,"p99_us":..,"status":..,...}
-- "status" counts responses that were not 2xx/3xx (wrk's own definition).

local method = os.getenv("MCP_METHOD") or "tools/call"
local tool = os.getenv("MCP_TOOL") or "echo"

local meta = '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
  .. '"io.modelcontextprotocol/clientCapabilities":{}}'
local params
if method == "tools/call" then
  params = '{"name":"' .. tool .. '","arguments":{"text":"hello"},' .. meta .. '}'
else
  params = '{' .. meta .. '}'
end

wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"' .. method .. '","params":' .. params .. '}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = method
if method == "tools/call" then
  wrk.headers["Mcp-Name"] = tool
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,"rps":%.1f,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f,'
      .. '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
