// What a host built on the official TypeScript SDK (@modelcontextprotocol/sdk)
// gets when it connects through COMMAND (`mcpctl bridge NAME`) to a server
// that cannot serve, and how long that takes.
//
// Usage: node ts_cannot_serve.mjs NODE_MODULES COMMAND [ARG...]; prints one
// JSON object: "opened" (the tool names) or "error" (the message the
// connect failed with), and "seconds" from spawning COMMAND to that outcome.
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, command, ...args] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(modules, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

const client = new Client({ name: "ts-host", version: "1" }, { capabilities: {} });
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const out = {};
const started = performance.now();
try {
  await client.connect(transport, { timeout: 60000 });
  out.opened = (await client.listTools()).tools.map((t) => t.name);
} catch (e) {
  out.error = e.message;
}
out.seconds = Math.round(performance.now() - started) / 1000;
console.log(JSON.stringify(out));
await client.close().catch(() => {});
process.exit(0);
