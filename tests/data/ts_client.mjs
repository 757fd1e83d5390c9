// What an MCP host built on the official TypeScript SDK
// (@modelcontextprotocol/sdk) gets from @modelcontextprotocol/server-everything:
// initialize, tools/list, tools/call, progress and sampling.
//
// Usage: node ts_client.mjs NODE_MODULES COMMAND [ARG...]; prints one JSON
// object (each check's outcome, or its error), like fidelity.py. A COMMAND
// that is one http:// URL is reached with StreamableHTTPClientTransport
// instead (with `Authorization: Bearer $MCPD_TOKEN` when that is set).
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, command, ...args] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(modules, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");
const { CreateMessageRequestSchema } = await load("types.js");

const client = new Client({ name: "ts-host", version: "1" }, { capabilities: { sampling: {} } });
client.setRequestHandler(CreateMessageRequestSchema, async () => ({
  role: "assistant",
  content: { type: "text", text: "sampled by the ts host" },
  model: "test-model",
}));
let transport;
if (command.startsWith("http://") && args.length === 0) {
  const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
  const headers = process.env.MCPD_TOKEN ? { Authorization: `Bearer ${process.env.MCPD_TOKEN}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(command), { requestInit: { headers } });
} else {
  transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
}
const out = {};
const check = async (name, step) => {
  try {
    out[name] = await step();
  } catch (e) {
    out[name] = `error: ${e.message}`;
  }
};
await client.connect(transport);
out.server = client.getServerVersion()?.name;
out.capabilities = Object.keys(client.getServerCapabilities() ?? {}).sort();
await check("tools", async () => (await client.listTools()).tools.map((t) => t.name).sort());
await check("call", async () => (await client.callTool({ name: "echo", arguments: { message: "hi" } })).content[0].text);
await check("progress", async () => {
  const steps = [];
  const result = await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 0.3, steps: 3 } },
    undefined,
    { onprogress: (p) => steps.push(p.progress) },
  );
  // The SDK hands notifications to handlers a microtask later than
  // responses, so the last step may come after the result and be dropped:
  // what must hold is that the steps arrive, in order.
  const inOrder = steps.length >= 2 && steps.every((s, i) => s === i + 1);
  return { inOrder, result: result.content[0].text.slice(0, 40) };
});
await check("sampling", async () => {
  const result = await client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hello", maxTokens: 10 } });
  return JSON.stringify(result).includes("sampled by the ts host");
});
await client.close();
console.log(JSON.stringify(out));
