// The npm tokenizers' ids for keel's exactness test (tests/data/tokenizer_exact.sh): for each text
// of a JSONL file (a "text" field per line) and of the torture set below, the ids of gpt-tokenizer
// (cl100k_base, o200k_base), of the tiktoken package (OpenAI's Rust core built to WASM; the
// reference where gpt-tokenizer's JavaScript regex differs, e.g. it takes U+FEFF for a space) and of
// llama3-tokenizer-js (Llama 3), one JSON line per text:
//   {"text": ..., "cl100k_base": [...], "o200k_base": [...], "llama3": [...],
//    "tiktoken": {"cl100k_base": [...], "o200k_base": [...]}}
//   node tests/data/tokenizer_oracle.mjs NODE_MODULES CORPUS.jsonl OUT.jsonl
import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { pathToFileURL } from "url";

const [modules, corpus, out] = process.argv.slice(2);
const require = createRequire(path.resolve(modules, "x.js"));
const cl100k = require("gpt-tokenizer/cjs/encoding/cl100k_base");
const o200k = require("gpt-tokenizer/cjs/encoding/o200k_base");
const llama = (await import(pathToFileURL(require.resolve("llama3-tokenizer-js")).href)).default;
const { get_encoding } = require("tiktoken");
const tiktoken = { cl100k_base: get_encoding("cl100k_base"), o200k_base: get_encoding("o200k_base") };
// Special-token text stays ordinary text (keel's Encode without allow_special).
const ordinary = { allowedSpecial: new Set(), disallowedSpecial: new Set() };

// Deterministic pseudo-random letters for the long words.
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const letters = (n, alphabet) => {
  const chars = Array.from(alphabet);  // code points, not UTF-16 halves
  return Array.from({ length: n }, () => chars[Math.floor(rand() * chars.length)]).join("");
};

const torture = [
  // Whitespace runs, line endings, tabs, trailing and leading spaces.
  "a  b   c    d", "   leading", "trailing   ", "\t\ttabs\tand  spaces \t", "one\ntwo\n\nthree\n\n\n",
  "crlf\r\nline\r\n\r\nend", " \n \n  \n", "x \n y", "\n\n\n\n\n\nword", "   \t\n\r\n  ", "a\u00a0b\u2003c\u3000d",
  // Digits.
  "1234567890", "3.14159265358979", "1,000,000 and 12,345.67", "2024-01-01T12:34:56Z", "0x1F and 0b1010",
  "phone: +1 (555) 123-4567", "١٢٣٤٥ ٠٩٨٧", "१२३४ and ½ ¾ ²³",
  // Contractions, upper and lower case, curly apostrophes.
  "I'm sure it's John's, we'll see, they've won, you'd think, I'D, WE'LL, It'S", "don’t can’t won’t",
  "'s 's 'S ''s ''' 'll 'LL 'Ll", "O'Neil's dog's bone's",
  // Letters of many scripts, combining marks.
  "Ünïcödé façade naïve coöperate Ångström", "Ελληνικά κείμενα", "Русский текст, ёжик", "العربية النص",
  "हिन्दी पाठ", "ไทย ภาษา", "e\u0301 a\u0308 n\u0303 combining", "ǅungla ǈ ǋ titlecase", "ſtraße ẞ ß",
  // Emoji: skin tones, ZWJ families, flags, keycaps.
  "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇺🇸 1️⃣ ❤️ 🤖🤖🤖", "emoji😀inside😀words", "🙂🙃😉😊😇🥰😍🤩😘",
  // CJK.
  "中文文本，包括标点。", "日本語のテキストです。カタカナ、ひらがな。", "한국어 텍스트입니다.", "混合English和中文123",
  // Punctuation and symbols.
  "!!! ??? ... --- *** ///", "<html><body>&amp;&lt;</body></html>", "def f(x):\n    return x**2  # comment",
  "{\"key\": [1, 2, {\"nested\": null}]}", "path/to/file.txt and C:\\Windows\\System32", "$€£¥₹ ©®™ §¶",
  "a/b/c\n/d//e", "email@example.com https://example.com/a?b=c&d=e#f",
  // Control characters and zero-width characters.
  "tab\tbell\u0007esc\u001bnull\u0000end", "zero\u200bwidth\u200cjoin\u200dnon", "soft\u00adhyphen",
  "nel\u0085line and\ufeffbom \u180e mongolian",  // White_Space edges: tiktoken and JS disagree
  // Long words: 10k characters of one letter, random letters, random CJK, digits.
  "a".repeat(10000), letters(10000, "abcdefghijklmnopqrstuvwxyz"), letters(3000, "的一是不了人我在有他这为之大来以个中上们"),
  "7".repeat(5000), " ".repeat(3000) + "x", "\n".repeat(2000), letters(4000, "aA1 .,\n'é中😀"),
];

const texts = [];
for (const line of fs.readFileSync(corpus, "utf8").split("\n")) if (line) texts.push(JSON.parse(line).text);
texts.push(...torture);
const lines = texts.map((text) => JSON.stringify({
  text,
  cl100k_base: cl100k.encode(text, ordinary),
  o200k_base: o200k.encode(text, ordinary),
  llama3: llama.encode(text, { bos: false, eos: false }),
  tiktoken: { cl100k_base: Array.from(tiktoken.cl100k_base.encode_ordinary(text)),
              o200k_base: Array.from(tiktoken.o200k_base.encode_ordinary(text)) },
}));
fs.writeFileSync(out, lines.join("\n") + "\n");
console.log(`wrote ${out}: ${texts.length} texts (${texts.length - torture.length} from ${corpus}, ${torture.length} torture)`);
