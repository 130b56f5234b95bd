// Single-thread encode throughput of the npm tiktoken package (OpenAI's Rust core built to WASM) on
// the texts of a JSONL file, the peer figure for bench/tokenizer_bench.sh, and of the pure
// JavaScript packages keel's ids are checked against (gpt-tokenizer for cl100k and o200k,
// llama3-tokenizer-js for Llama 3).
//   node bench/tokenizer_bench.js NODE_MODULES gpt2|cl100k|o200k|llama3 FILE.jsonl [seconds] [ASSETS]
// llama3 is not among tiktoken's own encodings: it is built from keel's rank file
// (ASSETS/tokenizers/llama3.tiktoken, which scripts/fetch_tokenizers.sh makes) with Llama 3's
// pattern, as Meta's tokenizer.py builds its tiktoken Encoding.
// Prints: "tiktoken warm_mb_s X tokens N bytes B js NAME Y" (best of repeated passes after one
// warm-up pass; the js field only where such a package exists).
const fs = require("fs");
const path = require("path");
const [modules, vocab, file, secs, assets] = process.argv.slice(2);
const seconds = Number(secs || 3);
const tiktoken = require(path.resolve(modules, "tiktoken"));
const texts = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
let enc;
if (vocab === "llama3") {
  const tokens = fs.readFileSync(path.join(assets, "tokenizers", "llama3.tiktoken"), "utf8")
    .split("\n").filter((l) => l).map((l) => l.split(" ")[0]);
  const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  enc = new tiktoken.Tiktoken("! 0 " + tokens.join(" "), { "<|end_of_text|>": 128001 }, pattern);
} else {
  enc = tiktoken.get_encoding({ gpt2: "gpt2", cl100k: "cl100k_base", o200k: "o200k_base" }[vocab]);
}
// Best seconds of repeated passes (after a warm-up pass) of encode over every text, and its tokens.
const measure = (encode) => {
  const pass = () => {
    const t0 = process.hrtime.bigint();
    let tokens = 0;
    for (const t of texts) tokens += encode(t).length;
    return [Number(process.hrtime.bigint() - t0) / 1e9, tokens];
  };
  let [best, tokens] = pass();
  const start = Date.now();
  while ((Date.now() - start) / 1e3 < seconds) best = Math.min(best, pass()[0]);
  return [best, tokens];
};

(async () => {
  const [best, tokens] = measure((t) => enc.encode_ordinary(t));
  enc.free();
  let js = "";
  if (vocab === "cl100k" || vocab === "o200k") {
    const g = require(path.resolve(modules, `gpt-tokenizer/cjs/encoding/${vocab}_base`));
    const none = { allowedSpecial: new Set(), disallowedSpecial: new Set() };
    js = ` js gpt-tokenizer ${(bytes / measure((t) => g.encode(t, none))[0] / 1e6).toFixed(2)}`;
  } else if (vocab === "llama3") {
    const url = require("url").pathToFileURL(require.resolve(path.resolve(modules, "llama3-tokenizer-js")));
    const llama = (await import(url.href)).default;
    const opts = { bos: false, eos: false };
    js = ` js llama3-tokenizer-js ${(bytes / measure((t) => llama.encode(t, opts))[0] / 1e6).toFixed(2)}`;
  }
  console.log(`tiktoken warm_mb_s ${(bytes / best / 1e6).toFixed(2)} tokens ${tokens} bytes ${bytes}${js}`);
})();
