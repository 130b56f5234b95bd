#!/usr/bin/env bash
# Rewrites the seed corpora fuzz/corpus/TARGET/ from the repo's real files: configs/*.toml, a
# dataset and a checkpoint written by the `keel` binary, the GPT-2 tokenizer files, Brown corpus
# lines. Seeds are small (a few KB) so that the fuzzer's mutations stay cheap. Multi-file seeds
# are joined with the separator of fuzz/fuzz_util.h (kSep).
#
#   fuzz/make_corpus.sh [KEEL_BINARY]      default: build/keel
set -euo pipefail
cd "$(dirname "$0")/.."
keel=$(realpath "${1:-build/keel}")
work=$(mktemp -d /tmp/keel-fuzz-corpus.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A small JSONL of Brown documents (texts cut to 300 characters) for prepare and the dataset.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open("assets/brown/brown.jsonl") as f, open(work + "/small.jsonl", "w") as out:
    for line in list(f)[:6]:
        d = json.loads(line)
        d["text"] = d["text"][:300]
        out.write(json.dumps(d) + "\n")
PY
OMP_NUM_THREADS=1 "$keel" data prepare "$work/small.jsonl" --out "$work/ds" --val-fraction 0.3 \
  --shard-tokens 100 --workers 1 >/dev/null
OMP_NUM_THREADS=1 "$keel" data prepare "$work/small.jsonl" --out "$work/ds-nfc" --val-fraction 0 \
  --nfc --dedup --min-chars 10 --on-error skip --workers 1 >/dev/null

# A checkpoint of the tiny test model on a flat token file, as tests/train/train_cli_test.cc does.
head -c 400000 ../shared/data/brown/brown.gpt2.u16 >"$work/brown.u16"
OMP_NUM_THREADS=2 "$keel" train configs/test-tiny.toml --set data.train="$work/brown.u16" \
  --set train.out_dir="$work/runs" --set train.steps=2 >/dev/null 2>&1

python3 - "$work" <<'PY'
import glob, json, os, shutil, struct, sys
work = sys.argv[1]
SEP = b"\n--keel-fuzz-part--\n"
root = "fuzz/corpus"

def put(target, name, data):
    os.makedirs(f"{root}/{target}", exist_ok=True)
    with open(f"{root}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def read(path):
    with open(path, "rb") as f:
        return f.read()

shutil.rmtree(root, ignore_errors=True)

# config: each config file; then with --set overrides; the resolved config.toml of a real run.
for path in sorted(glob.glob("configs/*.toml")):
    name = os.path.basename(path)[:-5]
    put("config", name, read(path))
    put("config", name + "-overrides",
        read(path) + SEP + b"optim.lr=1e-3" + SEP + b"train.precision=fp32" + SEP +
        b'data.train="x.u16"' + SEP + b"parallel.pp_layers=1,1")
put("config", "defaults-overrides", SEP + b"train.steps=5" + SEP + b"model.recompute=attn")
put("config", "resolved", read(f"{work}/runs/test-tiny/config.toml"))
put("config", "sources", read("configs/test-tiny.toml") +
    b'\n[[data.sources]]\npath = "a"\nweight = 2.0\n\n[[data.sources]]\npath = "b"\n')

# dataset_meta: the meta.json files `keel data prepare` wrote.
put("dataset_meta", "train", read(f"{work}/ds/train/meta.json"))
put("dataset_meta", "val", read(f"{work}/ds/val/meta.json"))
put("dataset_meta", "nfc-dedup", read(f"{work}/ds-nfc/train/meta.json"))

# dataset: meta.json + the shard files, once with the real hashes, once with "fill" (see
# fuzz_dataset.cc); the shards renamed to the names the target writes.
for split in ("train", "val"):
    meta = json.loads(read(f"{work}/ds/{split}/meta.json"))
    shards = meta["shards"][:3]
    meta["shards"] = shards
    meta["tokens"] = sum(s["tokens"] for s in shards)
    meta["documents"] = sum(s["documents"] for s in shards)
    files = []
    for i, s in enumerate(shards):
        files += [read(f"{work}/ds/{split}/{s['file']}"), read(f"{work}/ds/{split}/{s['index']}")]
        s["file"], s["index"] = f"shard_{i:05d}.bin", f"shard_{i:05d}.idx"
    put("dataset", split, SEP.join([json.dumps(meta, indent=1).encode()] + files))
    for s in shards:
        s["xxh3"] = s["index_xxh3"] = "fill"
    put("dataset", split + "-fill", SEP.join([json.dumps(meta, indent=1).encode()] + files))

# manifest: the real one, and a short one with its first tensors only.
ckpt = sorted(glob.glob(f"{work}/runs/test-tiny/checkpoints/step_*"))[-1]
manifest = json.loads(read(f"{ckpt}/manifest.json"))
put("manifest", "real", read(f"{ckpt}/manifest.json"))
manifest["tensors"] = manifest["tensors"][:3]
put("manifest", "short", json.dumps(manifest, indent=1))

# safetensors: the header of the trained model.safetensors alone (its ranges run past the end),
# and small files in the same layout with F32, BF16 and F16 tensors.
model = read(f"{work}/runs/test-tiny/model.safetensors")
(hlen,) = struct.unpack("<Q", model[:8])
put("safetensors", "real-header-only", model[:8 + hlen])
header = json.loads(model[8:8 + hlen])
def safetensors(tensors, metadata):
    h, data = {"__metadata__": metadata}, b""
    for name, dtype, shape, raw in tensors:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(h).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data
meta = header.get("__metadata__", {})
names = [k for k in header if k != "__metadata__"]
put("safetensors", "small-f32", safetensors(
    [(names[0], "F32", [2, 3], struct.pack("<6f", 1, -2, 0.5, 3e38, 1e-40, 0)),
     (names[1], "F32", [4], struct.pack("<4f", 1, 2, 3, 4))], meta))
put("safetensors", "small-bf16-f16", safetensors(
    [("a", "BF16", [3], struct.pack("<3H", 0x3F80, 0x7F80, 0xFFC1)),
     ("b", "F16", [2, 2], struct.pack("<4H", 0x3C00, 0x7C00, 0x0001, 0xFE00)),
     ("empty", "F32", [0, 5], b"")], {"keel.n_layer": "2"}))

# tokenizer_files: a 40-merge cut of GPT-2's vocabulary (as small_tokenizer.h makes) with texts.
enc = json.loads(read("assets/gpt2/encoder.json"))
for merges, text, special in ((40, "The jury said it did find that the election was conducted.", False),
                              (40, "Caf\u00e9 \u2014 na\u00efve <|endoftext|> 123  \n\n", True),
                              (0, "abc", False)):
    small = {t: i for t, i in enc.items() if i < 256 + merges}
    small["<|endoftext|>"] = 256 + merges
    bpe = b"\n".join(read("assets/gpt2/vocab.bpe").split(b"\n")[:merges + 1]) + b"\n"
    parts = [json.dumps(small).encode(), bpe, text.encode()] + ([b"special"] if special else [])
    put("tokenizer_files", f"merges{merges}{'-special' if special else ''}", SEP.join(parts))

# tokenizer_encode: Brown text, and text the pre-tokenizer treats specially.
brown = [json.loads(l)["text"] for l in open(f"{work}/small.jsonl")]
put("tokenizer_encode", "brown", brown[0][:300])
put("tokenizer_encode", "contractions", "I'll've they're we'd it's DON'T   spaces\t\ttabs\r\n")
put("tokenizer_encode", "unicode", "na\u00efve e\u0301 \u4e2d\u6587 \U0001F600 \u180e <|endoftext|>")
put("tokenizer_encode", "invalid-utf8", b"ok \xff\xfe \xc3 \xe2\x82 end")

# prepare_jsonl: a flags byte (see fuzz_prepare_jsonl.cc), then the file.
jsonl = read(f"{work}/small.jsonl")
put("prepare_jsonl", "brown", b"\x00" + jsonl)
put("prepare_jsonl", "brown-nfc-dedup-val", b"\x13" + jsonl + jsonl.split(b"\n")[0] + b"\n")
put("prepare_jsonl", "bad-lines-skip",
    b"\x04" + b'{"text": "ok"}\r\n\n   \nnot json\n[1]\n{"text": 5}\n{"id": 1}\n{"text": "e\\u0301"}\n')
put("prepare_jsonl", "text-chunked", b"\x68" + brown[1][:400].encode())
put("prepare_jsonl", "text-short", b"\x88" + b"hi\n")
PY

# dashboard_http: a selector byte, then what a client sends on one connection, its requests
# separated by SEP. Each seed twice: NAME with the connection kept open ("2", or "3" for the server
# with the token t0k), NAME-eof shut after the input ("0", "1", the requests joined); see
# fuzz_dashboard_http.cc.
python3 - <<'PY'
import os
SEP = "\n--keel-fuzz-part--\n"
root = "fuzz/corpus/dashboard_http"
os.makedirs(root, exist_ok=True)
def put(name, requests, token=False):
    for suffix, sel, sep in (("", 2, SEP), ("-eof", 0, "")):
        with open(f"{root}/{name}{suffix}", "wb") as f:
            f.write(str(sel + token).encode() + sep.join(requests).encode())
H = "Host: 127.0.0.1:8800\r\n"
put("page", ["GET / HTTP/1.1\r\n" + H + "User-Agent: Mozilla/5.0\r\nAccept: text/html\r\n\r\n"])
put("metrics", ["GET /api/metrics?run=0&since=0 HTTP/1.1\r\n" + H + "\r\n"])
put("events-since", ["GET /api/events?run=0&since=31 HTTP/1.1\r\n" + H +
                     "Connection: close\r\n\r\n"])
put("bad-params", ["GET /api/metrics?run=-1&since=99999999999999999999999 HTTP/1.1\r\n" + H +
                   "\r\n", "GET /api/events?since=x&run=0%00 HTTP/1.1\r\n\r\n"])
put("token-query", ["GET /?token=t0k HTTP/1.1\r\n" + H + "\r\n"], token=True)
put("token-bearer", ["GET /api/metrics?run=0&since=40 HTTP/1.1\r\n" + H +
                     "Authorization: Bearer t0k\r\n\r\n"], token=True)
put("token-wrong", ["GET /chart.js?token=t0 HTTP/1.1\r\n" + H +
                    "Authorization: Basic dDBr\r\n\r\n",
                    "GET /chart.js HTTP/1.1\r\n" + H + "Authorization: Bearer t0k\r\n\r\n"],
    token=True)
put("keep-alive", ["GET /api/metrics?run=0&since=0 HTTP/1.1\r\n" + H +
                   "Connection: keep-alive\r\n\r\n",
                   "GET /favicon.ico HTTP/1.1\r\n" + H + "\r\n",
                   "GET /chart.js HTTP/1.1\r\n" + H + "Range: bytes=0-3,5-\r\n\r\n",
                   "GET /api/events?run=0&since=0 HTTP/1.1\r\n" + H +
                   "Accept-Encoding: gzip\r\n\r\n"])
put("post-body", ["POST /api/metrics HTTP/1.1\r\n" + H + "Content-Length: 11\r\n\r\nhello world",
                  "GET /nothing HTTP/1.0\r\n\r\n"])
put("chunked", ["GET /api/events?run=0 HTTP/1.1\r\n" + H +
                "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"])
put("head-options", ["HEAD / HTTP/1.1\r\n" + H + "\r\n", "OPTIONS * HTTP/1.1\r\n" + H + "\r\n"])
put("bad-request-line", ["GARBAGE\r\n\r\n", "GET\r\n \r\n"])
put("split-request", ["GET /api/metr", "ics?run=0 HTTP/1.1\r\n" + H + "\r\n"])
put("huge-header", ["GET / HTTP/1.1\r\n" + H + "X-Big: " + "a" * 9000 + "\r\n\r\n"])
PY

# hf_llama: a tiny Llama folder as save_pretrained writes it (config.json, then an index or an
# empty part, then one or two shards; see fuzz_hf_llama.cc).
python3 - <<'PY'
import json, os, struct
SEP = b"\n--keel-fuzz-part--\n"
root = "fuzz/corpus/hf_llama"
os.makedirs(root, exist_ok=True)
def put(name, parts):
    with open(f"{root}/{name}", "wb") as f:
        f.write(SEP.join(p if isinstance(p, bytes) else p.encode() for p in parts))

V, C, F, HEADS, KV, L = 16, 8, 16, 2, 1, 2
hs = C // HEADS
def config(drop=(), **extra):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
         "intermediate_size": F, "num_attention_heads": HEADS, "num_key_value_heads": KV,
         "num_hidden_layers": L, "vocab_size": V, "max_position_embeddings": 64,
         "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
         "tie_word_embeddings": False, "torch_dtype": "float32"}
    c.update(extra)
    for key in drop:
        del c[key]
    return json.dumps(c, indent=2)
def tensors(tied=False):
    t = [("model.embed_tokens.weight", [V, C])]
    for l in range(L):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", [C]), (p + "self_attn.q_proj.weight", [HEADS * hs, C]),
              (p + "self_attn.k_proj.weight", [KV * hs, C]),
              (p + "self_attn.v_proj.weight", [KV * hs, C]),
              (p + "self_attn.o_proj.weight", [C, HEADS * hs]),
              (p + "post_attention_layernorm.weight", [C]),
              (p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]),
              (p + "mlp.down_proj.weight", [C, F])]
    t += [("model.norm.weight", [C])] + ([] if tied else [("lm_head.weight", [V, C])])
    return t
def raw(dtype, n, seed):
    vals = [((i * 37 + seed * 11) % 19 - 9) / 16 for i in range(n)]
    if dtype == "F32":
        return struct.pack(f"<{n}f", *vals)
    if dtype == "BF16":
        return b"".join(struct.pack("<f", v)[2:] for v in vals)
    return struct.pack(f"<{n}e", *vals)  # F16
def safetensors(named, dtype="F32"):
    h, data = {"__metadata__": {"format": "pt"}}, b""
    for i, (name, shape) in enumerate(named):
        n = 1
        for d in shape:
            n *= d
        b = raw(dtype, n, i)
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    text = json.dumps(h).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data
def index(first, second):
    m = {n: "model-00001-of-00002.safetensors" for n, _ in first}
    m.update({n: "model-00002-of-00002.safetensors" for n, _ in second})
    return json.dumps({"metadata": {"total_size": 0}, "weight_map": m}, indent=2)

t = tensors()
put("single", [config(), "", safetensors(t)])
first, second = t[:1 + 9], t[1 + 9:]  # the embedding and layer 0; the rest
put("sharded", [config(), index(first, second), safetensors(first), safetensors(second, "BF16")])
tied = tensors(tied=True) + [("model.layers.0.self_attn.rotary_emb.inv_freq", [hs // 2])]
put("tied-f16", [config(tie_word_embeddings=True, head_dim=hs), "",
                 safetensors(tied, "F16")])
# No num_key_value_heads: as many as num_attention_heads.
put("mha-no-kv-heads", [config(drop=["num_key_value_heads"]), "", safetensors(
    [(n, [HEADS * hs, C]) if ("k_proj" in n or "v_proj" in n) else (n, s) for n, s in t])])
# model.norm.weight in both shards, listed once in the index.
dup = second[-2:-1]
put("duplicate-across-shards", [config(), index(first, second), safetensors(first + dup),
                                safetensors(second)])
PY

echo "wrote $(find fuzz/corpus -type f | wc -l) seeds, $(du -sh fuzz/corpus | cut -f1)"
