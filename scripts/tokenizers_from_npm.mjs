// Writes the cl100k_base, o200k_base and Llama 3 vocabularies as tiktoken rank files (one
// "BASE64_BYTES RANK" line per token, the format tiktoken reads), from the npm packages tiktoken
// (OpenAI's ranks, as its encoders/*.json carry them) and llama3-tokenizer-js (Meta's Llama 3
// vocabulary in the byte-to-unicode form of Hugging Face's tokenizer.json). Run by
// scripts/fetch_tokenizers.sh:
//   node scripts/tokenizers_from_npm.mjs NODE_MODULES OUT_DIR
import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { pathToFileURL } from "url";

const [modules, out] = process.argv.slice(2);
if (!modules || !out) {
  console.error("usage: node tokenizers_from_npm.mjs NODE_MODULES OUT_DIR");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });
const require = createRequire(path.resolve(modules, "x.js"));

function write(name, lines) {
  const file = path.join(out, name);
  fs.writeFileSync(file + ".tmp", lines.join("\n") + "\n");
  fs.renameSync(file + ".tmp", file);
  console.log(`wrote ${file}: ${lines.length} tokens`);
}

// tiktoken's encoders/NAME.json: bpe_ranks is lines of "NAME OFFSET TOKEN TOKEN ...", the tokens
// base64 and ranked OFFSET, OFFSET + 1, ...
for (const name of ["cl100k_base", "o200k_base"]) {
  const j = require(`tiktoken/encoders/${name}.json`);
  const lines = [];
  for (const line of j.bpe_ranks.split("\n")) {
    if (!line) continue;
    const parts = line.split(" ");
    const offset = Number(parts[1]);
    parts.slice(2).forEach((tok, i) => lines.push(`${tok} ${offset + i}`));
  }
  write(`${name}.tiktoken`, lines);
}

// GPT-2's byte ↔ unicode mapping (the printable characters stand for themselves, the others are
// shifted past 255), which tokenizer.json's vocabulary strings use.
const unicodeToByte = new Map();
{
  const keep = [];
  for (let b = 33; b <= 126; ++b) keep.push(b);
  for (let b = 161; b <= 172; ++b) keep.push(b);
  for (let b = 174; b <= 255; ++b) keep.push(b);
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    const code = keep.includes(b) ? b : 256 + n++;
    unicodeToByte.set(String.fromCodePoint(code), b);
  }
}
const llama = (await import(pathToFileURL(require.resolve("llama3-tokenizer-js")).href)).default;
const lines = [];
for (let id = 0; id < llama.vocabById.length; ++id) {
  const s = llama.vocabById[id];
  if (s.startsWith("<|") && s.endsWith("|>") && id >= 128000) continue;  // special tokens
  const bytes = Buffer.from(Array.from(s, (ch) => {
    const b = unicodeToByte.get(ch);
    if (b === undefined) throw new Error(`llama3 token ${id}: character ${ch} is not byte-level`);
    return b;
  }));
  lines.push(`${bytes.toString("base64")} ${id}`);
}
write("llama3.tiktoken", lines);

// The same vocabulary as a Hugging Face tokenizer.json (byte-level BPE, its merges in priority
// order, Llama 3's pre-token pattern and special tokens), as Meta's model folders carry it: the
// input of Tokenizer::LoadHfJson in the exactness test.
const vocab = {};
const added = [];
llama.vocabById.forEach((s, id) => {
  if (id >= 128000) added.push({ id, content: s, single_word: false, lstrip: false, rstrip: false,
                                 normalized: false, special: true });
  else vocab[s] = id;
});
const merges = [...llama.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => k);
const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const json = {
  version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null, decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true,
                                   use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
           end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
           vocab, merges },
};
fs.writeFileSync(path.join(out, "llama3-tokenizer.json.tmp"), JSON.stringify(json));
fs.renameSync(path.join(out, "llama3-tokenizer.json.tmp"), path.join(out, "llama3-tokenizer.json"));
console.log(`wrote ${path.join(out, "llama3-tokenizer.json")}: ${merges.length} merges`);
