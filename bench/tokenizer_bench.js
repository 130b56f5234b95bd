// Single-thread GPT-2 encode throughput of the npm tiktoken package (WASM) on the texts of a
// JSONL file: the peer figure for bench/tokenizer_bench.sh.
//   node bench/tokenizer_bench.js FILE.jsonl [seconds]
// Prints: "tiktoken warm_mb_s X tokens N" (best of repeated passes after one warm-up pass).
const fs = require("fs");
const path = require("path");
const { get_encoding } = require(path.join(__dirname, "node_modules", "tiktoken"));
const file = process.argv[2];
const seconds = Number(process.argv[3] || 3);
const texts = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
const enc = get_encoding("gpt2");
const pass = () => {
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const t of texts) tokens += enc.encode_ordinary(t).length;
  return [Number(process.hrtime.bigint() - t0) / 1e9, tokens];
};
let [best, tokens] = pass();
const start = Date.now();
while ((Date.now() - start) / 1e3 < seconds) best = Math.min(best, pass()[0]);
console.log(`tiktoken warm_mb_s ${(bytes / best / 1e6).toFixed(2)} tokens ${tokens} bytes ${bytes}`);
enc.free();
