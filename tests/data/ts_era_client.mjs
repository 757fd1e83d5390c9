// What an MCP host built on the official TypeScript SDK
// (@modelcontextprotocol/sdk 1.x, which speaks only the 2025 era: it opens
// with initialize) gets from the Python SDK's dual-era example server
// (tests/data/py_everything_stdio.py): lists, a read, a prompt, a call, and
// the tools that ask the host for input by an InputRequiredResult (at
// 2026-07-28), which reach a 2025 host as ordinary server→client requests
// when mcpd speaks 2026-07-28 with the server for it.
//
// Usage: node ts_era_client.mjs NODE_MODULES COMMAND [ARG...]; prints one
// JSON object: each check's outcome (or "error: ..."), and how often each of
// the host's handlers ran during each input check. Every wait is bounded.
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, command, ...args] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(modules, "@modelcontextprotocol/sdk/dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");
const { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } = await load("types.js");

const WAIT = 10_000; // milliseconds any one check may take
const calls = { elicitation: 0, sampling: 0, roots: 0 };

const client = new Client(
  { name: "ts-era-host", version: "1" },
  { capabilities: { sampling: {}, elicitation: { form: {} }, roots: {} } },
);
client.setRequestHandler(CreateMessageRequestSchema, async () => {
  calls.sampling += 1;
  return { role: "assistant", content: { type: "text", text: "sampled by the ts host" }, model: "test-model" };
});
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  calls.elicitation += 1;
  // Every required string answered with one text, per question.
  const schema = request.params.requestedSchema ?? {};
  const content = {};
  for (const key of schema.required ?? []) {
    const type = schema.properties?.[key]?.type ?? "string";
    content[key] = type === "boolean" ? true : `${key} from the ts host`;
  }
  return { action: "accept", content };
});
client.setRequestHandler(ListRootsRequestSchema, async () => {
  calls.roots += 1;
  return { roots: [{ uri: "file:///srv/ts", name: "ts" }] };
});

const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const out = {};
const check = async (name, step) => {
  try {
    out[name] = await step();
  } catch (e) {
    out[name] = `error: ${e.message}`;
  }
};
const timeout = setTimeout(() => {
  console.log(JSON.stringify({ ...out, timeout: `after ${WAIT * 4} ms` }));
  process.exit(1);
}, WAIT * 4);
await client.connect(transport, { timeout: WAIT });
out.capabilities = Object.keys(client.getServerCapabilities() ?? {}).sort();
out.server = client.getServerVersion()?.name;
const opts = { timeout: WAIT };
const text = (result) => (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join(" ");
await check("tools", async () => (await client.listTools(undefined, opts)).tools.length);
await check("resources", async () => (await client.listResources(undefined, opts)).resources.map((r) => r.uri).sort());
await check("read", async () => (await client.readResource({ uri: "test://static-text" }, opts)).contents[0].text.slice(0, 40));
await check("prompts", async () => (await client.listPrompts(undefined, opts)).prompts.map((p) => p.name).sort());
await check("prompt", async () => (await client.getPrompt({ name: "test_simple_prompt" }, opts)).messages[0].content.text.slice(0, 40));
await check("call", async () => text(await client.callTool({ name: "test_simple_text", arguments: {} }, undefined, opts)));
for (const name of ["elicitation", "sampling", "list_roots", "multiple_inputs", "multi_round", "tampered_state"]) {
  await check(name, async () => {
    const before = { ...calls };
    const result = await client.callTool({ name: `test_input_required_result_${name}`, arguments: {} }, undefined, opts);
    const asked = Object.fromEntries(Object.keys(calls).map((k) => [k, calls[k] - before[k]]));
    return { asked, error: Boolean(result.isError), text: text(result) };
  });
}
clearTimeout(timeout);
await client.close();
console.log(JSON.stringify(out));
