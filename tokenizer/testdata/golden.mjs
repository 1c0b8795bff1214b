// Generates qwen3_golden.json: token ids from an independent implementation
// (@lenml/tokenizers 3.7.2) and chat renderings from @huggingface/jinja
// 0.5.11, for tokenizer_test.go to compare against.
//
//   cd tokenizer/testdata && npm install @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11 \
//     && node golden.mjs /path/to/qwen3/models > qwen3_golden.json
import fs from "node:fs";
import path from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";
import { Template } from "@huggingface/jinja";

const dir = process.argv[2];
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const encode = (s) => tok.encode(s, { add_special_tokens: false });

const texts = [
  "Hello, my dog is cute",
  "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it? We'll see; they've gone, I'm here, you'd know.",
  "SHOUTING IT'S LOUD AND THEY'RE HERE",
  "func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx[i] = i * 2 // double\n\t}\n}\n",
  "def f(x):\n    return [y ** 2 for y in range(x) if y % 3 == 0]\n\n\nclass A(B):\n    pass\n",
  "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%smith%';",
  "日本語のテキストを正しく分割できますか？東京は日本の首都です。",
  "中文分词测试：我们今天去北京天安门广场。",
  "한국어 문장도 포함합니다. 안녕하세요!",
  "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ❤️",
  "   leading spaces, trailing spaces   ",
  "tabs\t\tand\nnewlines\n\n\nand\r\nwindows\r\n\r\nlines",
  "multiple     inner      spaces          here",
  "\n\n\n",
  "    ",
  "numbers 1234567890 3.14159 -42 1e10 0x1F 1,000,000",
  "Café naïve résumé coöperate: e\u0301 (combining) vs é (precomposed), Å vs A\u030a",
  "Special tokens in text: <|im_start|>user\nhi<|im_end|>\n<|endoftext|> and <tool_call>{}</tool_call>",
  "URLs https://example.com/path?q=1&r=2#frag and emails a.b@c.de",
  "Mixed: English中文English123中文 and русский текст, ελληνικά, العربية, עברית",
  "punctuation!!! ??? ... --- *** ### $$$ %%% ^^^ &&& (((",
  "a'b a's A'S a'Re x'LL y'd z'VE m'm",
  "ſ Kelvin K Ǆ ǅ ǆ ﬁ ligature",
  "```json\n{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}\n```",
  "x".repeat(300),
  "ab ".repeat(100),
  "\u00a0nbsp\u2003em-space\u3000ideographic space\u200bzero-width",
];

const tools = [
  { type: "function", function: { name: "get_weather", description: "Get the weather for a city", parameters: { type: "object", properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] } } },
  { type: "function", function: { name: "search", description: "Search the web", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } },
];

const chats = [
  { messages: [{ role: "user", content: "Hello!" }] },
  { messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: "What is the capital of France?" }, { role: "assistant", content: "Paris." }, { role: "user", content: "And of Japan? 日本" }] },
  { messages: [{ role: "system", content: "You are a router test." }, { role: "user", content: "Weather in Paris?" }, { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "c" } } }] }, { role: "tool", content: "{\"temp\": 21}" }, { role: "user", content: "Thanks 😀" }], tools },
  { messages: [{ role: "user", content: "Think first." }, { role: "assistant", content: "<think>\nreasoning here\n</think>\n\nThe answer is 42." }, { role: "user", content: "Again" }] },
];

const out = { tokenizer: "@lenml/tokenizers 3.7.2", jinja: "@huggingface/jinja 0.5.11", texts: [], chats: [] };
for (const text of texts) out.texts.push({ text, ids: encode(text) });
const tmpl = new Template(tokenizerConfig.chat_template);
for (const c of chats) {
  const rendered = tmpl.render({ messages: c.messages, tools: c.tools, add_generation_prompt: true, bos_token: "", eos_token: tokenizerConfig.eos_token });
  out.chats.push({ messages: c.messages, tools: c.tools ?? null, rendered, ids: encode(rendered) });
}
process.stdout.write(JSON.stringify(out, null, 1) + "\n");
