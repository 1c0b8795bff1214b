// Drives the router with the OpenAI Node SDK's responses.create, as an
// agent client does: a request with instructions and a tool, then a
// streamed follow-up by previous_response_id. Prints one JSON line per
// request for sdk_test.go to check.
//
//   node responses_sdk.mjs <path to the openai package> <router base URL>
import path from "node:path";
import { pathToFileURL } from "node:url";

const [pkg, base] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(path.join(pkg, "index.mjs")).href);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0 });
const tools = [{ type: "function", name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }, strict: false }];
const instructions = "You answer questions about the weather. ".repeat(40);

const first = await client.responses.create({ model: "m", instructions, tools, input: "Weather in Paris?", max_output_tokens: 8 });
console.log(JSON.stringify({ id: first.id, status: first.status, text: first.output_text, usage: first.usage }));

const stream = await client.responses.create({ model: "m", instructions, tools, previous_response_id: first.id,
  input: [{ role: "user", content: [{ type: "input_text", text: "And in Rome?" }] }], max_output_tokens: 6, stream: true });
const types = [];
let text = "";
let final = null;
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === "response.output_text.delta") text += ev.delta;
  if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
}
console.log(JSON.stringify({ id: final?.id, status: final?.status, text, types, usage: final?.usage }));
