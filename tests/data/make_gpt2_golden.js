// Writes tests/data/gpt2_golden.json: tricky strings and their ids under the npm tiktoken
// package's gpt2 encoding, the peer keel's tokenizer must match. Run from the repo root after
// `npm install --prefix bench tiktoken`:  node tests/data/make_gpt2_golden.js
const path = require("path");
const fs = require("fs");
const { get_encoding } = require(path.resolve("bench/node_modules/tiktoken"));
const enc = get_encoding("gpt2");
const letters = (n, seed) => {
  let s = "", x = seed;
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; s += "abcdefghijklmnopqrstuvwxyz"[x % 26]; }
  return s;
};
const texts = [
  "Hello world", " Hello", "hello  world", "a\n\nb", "a \n b", "  \n\n  x", "x  ", "\t\t\tindent",
  "don't won't I'm you're we've they'll she'd it's", "DON'T 'S 's 'd 'll", "'''", "''s",
  "1234567890 12 3.14 1e10 -5", "٣٤٥ ½ Ⅻ", "mixed\u00a0nbsp\u2003em\u3000ideo", "a\u180eb \u180e",
  "x\u2028y\u2029z\u0085w", "😀👍🏽 👨‍👩‍👧‍👦 🇫🇷", "日本語のテキスト、中文文本。한국어", "e\u0301 a\u030a\u0301",
  "Ελληνικά Русский עברית العربية हिन्दी", "<|endoftext|>", "tab\tsep\tvalues\r\nline",
  "!!!???...,,,;;;", " !!! ", "@@@###$$$", "http://example.com/a?b=c&d=e#f", "#include <stdio.h>",
  "    def f(x):\n        return x  # comment\n", "a".repeat(300), " " + letters(200, 1),
  letters(1000, 2), "ab".repeat(150), "The quick brown fox jumps over the lazy dog. ".repeat(5),
  "      ", "\n", " ", "\u00e9t\u00e9 na\u00efve caf\u00e9", "x".repeat(129), "1".repeat(300),
];
const cases = texts.map((text) => ({ text, ids: Array.from(enc.encode_ordinary(text)) }));
const out = { source: "node tests/data/make_gpt2_golden.js (npm tiktoken " +
  require(path.resolve("bench/node_modules/tiktoken/package.json")).version + ", gpt2)", cases };
fs.writeFileSync("tests/data/gpt2_golden.json", JSON.stringify(out, null, 0) + "\n");
enc.free();
