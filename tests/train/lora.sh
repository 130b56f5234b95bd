#!/usr/bin/env bash
# LoRA end to end on a tiny GPT-2 fine-tuned from a model file (fp32):
#  1. layout equivalence: dp 2 (ZeRO 0 and 1) and pp 2 (2 micro-batches) give one process's losses
#     within 1e-5; at ZeRO 0 the gradient all-reduce sends the adapters' gradients only
#     (comm_bytes = 2 x 4 bytes x adapters x (dp-1)/dp per step);
#  2. exact resume: stop at step 6, resume to 12: bitwise the losses of the run that never stopped;
#  3. the run's model file holds the merged weights (no adapter tensors) and keel generate reads it;
#  4. tp 2, the adapters split the way their base matrices are (with and without sequence
#     parallelism, and a Llama's fused q, k, v adapter under grouped-query attention), gives one
#     process's losses within 1e-5, only the whole factors' gradients summed over the tp group,
#     and resumes bitwise; an int8 base at tp 2 gives the int8 run's losses within 1e-7 (a row
#     cut by columns is quantized with the whole row's scale); ZeRO 2, and an nf4 base whose
#     rows on a tp rank are not whole groups of 64, are refused with one line;
#  4a. ZeRO 3 (the frozen base, and a quantized one's codes and scales, sharded over dp and
#     gathered a block at a time): dp 2 gives ZeRO 1's losses bitwise (LoRA, and DoRA with
#     dropout), a run stopped at ZeRO 1 resumes at ZeRO 3 bitwise, int8 and nf4 bases give one
#     process's losses within 1e-5, and each rank holds at most 51% of the base's bytes; the
#     frozen embeddings are gathered at the first step only (fewer bytes from the second on);
#     `keel ckpt verify` passes the adapter-only checkpoints;
#  4b. dropout ([lora] dropout = 0.3): the masks depend on the seed, step, product and the
#     element's place in the global batch only, so dp 2 (ZeRO 1, 2 micro-batches), pp 2 and tp 2
#     give one process's losses within 1e-5, and a resume is bitwise; they differ from no dropout;
#  4c. the base read a tensor at a time (a keel model file, an HF Llama folder; never whole in
#     fp32) gives the losses of the same base read whole (an HF GPT-2 file), bitwise, LoRA and
#     DoRA; a Llama from its HF folder equals it from the keel file, and at tp 2 (each rank cuts its
#     shards from the file's tensors) within 1e-5;
#  5. checkpoints hold the adapters alone (master and moments), the frozen base named in
#     state.base: `keel ckpt export` of the last checkpoint, which rebuilds the base from
#     init_from, writes the same bytes as the export of the run's model file, fp32 and bf16 (whose
#     base is kept, and rebuilt, as its bf16 rounding);
#  6. an int8 base ([lora] base = "int8"): the memory line counts its codes and scales, its losses
#     stay within 1e-3 of the unquantized base's, the resume is bitwise, and the checkpoint's
#     export (the base rebuilt, quantized and dequantized again) is the model file's; an unknown
#     base is refused with one line;
#  7. from random weights (no init_from: the base is drawn a tensor at a time, each pipeline
#     stage its own tensors): pp 2 gives one process's losses within 1e-5, and an int8 run resumes
#     bitwise;
#  8. DoRA ([lora] dora = true): dp 2 (ZeRO 1, 2 micro-batches), pp 2 and tp 2 (with and without
#     sequence parallelism; a grouped-query Llama too) give one process's losses within 1e-5
#     (from a model file, and pp 2 and tp 2 from random weights, whose magnitudes each stage and
#     shard draws from its own base rows), a resume is bitwise, the losses differ from LoRA's, the
#     checkpoint's export is the model file's (fp32 and bf16), an int8 base stays within 1e-3 of
#     the unquantized one's losses; with dropout 0.3 (PEFT's form), dp 2, pp 2 and tp 2 with and
#     without sequence parallelism give one process's losses within 1e-5 and a resume is bitwise; the
#     PEFT export of the tp 2 checkpoint (magnitudes cut as B is) is one process's within 1e-4;
#  9. fp16 (train.precision = "fp16", the base kept as its fp16 rounding): every step's loss within
#     1e-4 of the fp32 run's (bf16's are 1e-3 away), and on an int8 base (dequantized into fp16)
#     within 1e-4 of fp32's int8 run; a resume is bitwise; the checkpoint's export is the model
#     file's.
#   tests/train/lora.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1)
run() {  # NAME [LAUNCHER...] -- [ARGS...]
  local name=$1; shift
  local launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done; shift
  OMP_NUM_THREADS=1 "${launch[@]}" "$keel" train "$src/configs/test-tiny.toml" \
    --set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.name="$name" "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}
run base -- --set train.steps=10 --set optim.lr=1e-2
lora=(--set train.steps=12 --set train.batch_size=8 --set optim.lr=1e-2 --set lora.rank=4
      --set lora.targets=all --set model.init_from="$tmp/base/model.safetensors")
run single -- "${lora[@]}"
run dp "${mpi[@]}" -- "${lora[@]}" --set parallel.zero=1 --set train.micro_batch_size=2
run z3 "${mpi[@]}" -- "${lora[@]}" --set parallel.zero=3 --set train.micro_batch_size=2
run z3r "${mpi[@]}" -- "${lora[@]}" --set parallel.zero=1 --set train.micro_batch_size=2 \
  --set train.stop_at=6
run z3r "${mpi[@]}" -- "${lora[@]}" --set parallel.zero=3 --set train.micro_batch_size=2 \
  --resume auto
run dp0 "${mpi[@]}" -- "${lora[@]}"
run pp "${mpi[@]}" -- "${lora[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
run tp "${mpi[@]}" -- "${lora[@]}" --set parallel.tp=2
run tpsp "${mpi[@]}" -- "${lora[@]}" --set parallel.tp=2 --set parallel.sp=true
run tpr "${mpi[@]}" -- "${lora[@]}" --set parallel.tp=2 --set train.stop_at=6
run tpr "${mpi[@]}" -- "${lora[@]}" --set parallel.tp=2 --resume auto
llama=(--set model.name=llama-tiny --set train.steps=8 --set train.batch_size=4 --set optim.lr=1e-2
       --set lora.rank=4 --set lora.targets=all)
run llama -- "${llama[@]}"
run llamatp "${mpi[@]}" -- "${llama[@]}" --set parallel.tp=2
drop=("${lora[@]}" --set lora.dropout=0.3)
run drop -- "${drop[@]}"
run dropdp "${mpi[@]}" -- "${drop[@]}" --set parallel.zero=1 --set train.micro_batch_size=2
run droppp "${mpi[@]}" -- "${drop[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
run droptp "${mpi[@]}" -- "${drop[@]}" --set parallel.tp=2
run dropr -- "${drop[@]}" --set train.stop_at=6
run dropr -- "${drop[@]}" --resume auto
dora=("${lora[@]}" --set lora.dora=true)
run dora -- "${dora[@]}"
run doradp "${mpi[@]}" -- "${dora[@]}" --set parallel.zero=1 --set train.micro_batch_size=2
run dorapp "${mpi[@]}" -- "${dora[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
run dorar -- "${dora[@]}" --set train.stop_at=6
run dorar -- "${dora[@]}" --resume auto
run dorabf16 -- "${dora[@]}" --set train.precision=bf16
run doraint8 -- "${dora[@]}" --set lora.base=int8
run doratp "${mpi[@]}" -- "${dora[@]}" --set parallel.tp=2
run doratpsp "${mpi[@]}" -- "${dora[@]}" --set parallel.tp=2 --set parallel.sp=true
run llamadora -- "${llama[@]}" --set lora.dora=true
run llamadoratp "${mpi[@]}" -- "${llama[@]}" --set lora.dora=true --set parallel.tp=2
# The base file read a tensor at a time (a keel file, an HF Llama folder) against one read whole
# (an HF GPT-2 file: its Conv1D matrices are transposed whole).
"$keel" ckpt export "$tmp/base/model.safetensors" --out "$tmp/base-hf.safetensors" >/dev/null
hf=(--set model.init_from="$tmp/base-hf.safetensors")
run hfgpt2 -- "${lora[@]}" "${hf[@]}"
run hfdora -- "${dora[@]}" "${hf[@]}"
run llamabase -- --set model.name=llama-tiny --set train.steps=3 --set optim.lr=1e-2
"$keel" ckpt export "$tmp/llamabase/model.safetensors" --out "$tmp/llama-hf" >/dev/null
fromfile=(--set model.init_from="$tmp/llamabase/model.safetensors")
run llamafile -- "${llama[@]}" --set lora.dora=true "${fromfile[@]}"
run llamahf -- "${llama[@]}" --set lora.dora=true --set model.init_from="$tmp/llama-hf"
run llamahftp "${mpi[@]}" -- "${llama[@]}" --set lora.dora=true \
  --set model.init_from="$tmp/llama-hf" --set parallel.tp=2
dd=("${dora[@]}" --set lora.dropout=0.3)
run dd -- "${dd[@]}"
run dddp "${mpi[@]}" -- "${dd[@]}" --set parallel.zero=1 --set train.micro_batch_size=2
run ddz3 "${mpi[@]}" -- "${dd[@]}" --set parallel.zero=3 --set train.micro_batch_size=2
run ddpp "${mpi[@]}" -- "${dd[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
run ddtp "${mpi[@]}" -- "${dd[@]}" --set parallel.tp=2 --set parallel.sp=true
run ddtp0 "${mpi[@]}" -- "${dd[@]}" --set parallel.tp=2
run ddr -- "${dd[@]}" --set train.stop_at=6
run ddr -- "${dd[@]}" --resume auto
run resumed -- "${lora[@]}" --set train.stop_at=6
run resumed -- "${lora[@]}" --resume auto
run bf16 -- "${lora[@]}" --set train.precision=bf16
run int8 -- "${lora[@]}" --set lora.base=int8
run int8tp "${mpi[@]}" -- "${lora[@]}" --set lora.base=int8 --set parallel.tp=2
run int8z3 "${mpi[@]}" -- "${lora[@]}" --set lora.base=int8 --set parallel.zero=3 \
  --set train.micro_batch_size=2
run int8r -- "${lora[@]}" --set lora.base=int8 --set train.stop_at=6
run int8r -- "${lora[@]}" --set lora.base=int8 --resume auto
run f16 -- "${lora[@]}" --set train.precision=fp16
run f16int8 -- "${lora[@]}" --set train.precision=fp16 --set lora.base=int8
run f16r -- "${lora[@]}" --set train.precision=fp16 --set train.stop_at=6
run f16r -- "${lora[@]}" --set train.precision=fp16 --resume auto
scratch=(--set train.steps=8 --set train.batch_size=8 --set optim.lr=1e-2 --set lora.rank=4
         --set lora.targets=all)
run rand -- "${scratch[@]}"
run randpp "${mpi[@]}" -- "${scratch[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
run randq -- "${scratch[@]}" --set lora.base=int8 --set train.stop_at=4
run randq -- "${scratch[@]}" --set lora.base=int8 --resume auto
run randq1 -- "${scratch[@]}" --set lora.base=int8
run randdora -- "${scratch[@]}" --set lora.dora=true
run randdorapp "${mpi[@]}" -- "${scratch[@]}" --set lora.dora=true --set parallel.pp=2 \
  --set train.micro_batch_size=2
run randdoratp "${mpi[@]}" -- "${scratch[@]}" --set lora.dora=true --set parallel.tp=2
grep -Eq "memory per rank.* quantized_base [0-9.]+," "$tmp/int8.log" &&
  ! grep -q quantized_base "$tmp/single.log" || { echo "memory lines:"; grep -h "memory" "$tmp"/*.log; exit 1; }
for name in single bf16 int8 dora dorabf16 f16 f16int8; do
  last=$(ls -d "$tmp/$name"/checkpoints/step_* | tail -1)
  "$keel" ckpt export "$last" --out "$tmp/$name-ckpt/model.safetensors" >/dev/null
  "$keel" ckpt export "$tmp/$name/model.safetensors" --out "$tmp/$name-file/model.safetensors" >/dev/null
  cmp "$tmp/$name-ckpt/model.safetensors" "$tmp/$name-file/model.safetensors" ||
    { echo "$name: the checkpoint's export (base rebuilt) differs from the model file's"; exit 1; }
done
grep -q "LoRA rank 4, alpha 8 on attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj" "$tmp/single.log" ||
  { cat "$tmp/single.log"; exit 1; }
"$keel" generate --run "$tmp/single/model.safetensors" --prompt "The" --max-tokens 4 >/dev/null
refused() {  # NAME LINE [ARGS...]: 2 ranks, exit 2 with LINE in the log
  local name=$1 line=$2 rc=0; shift 2
  "${mpi[@]}" "$keel" train "$src/configs/test-tiny.toml" --set data.train="$tmp/tokens.u16" \
    --set train.out_dir="$tmp" --set train.name="$name" "${lora[@]}" "$@" >"$tmp/$name.log" 2>&1 ||
    rc=$?
  [[ $rc == 2 ]] && grep -q "$line" "$tmp/$name.log" ||
    { echo "$name: exit $rc, expected 2 and \"$line\""; cat "$tmp/$name.log"; exit 1; }
}
lora=("${scratch[@]}" --set model.n_embd=64)  # random weights of a 64-wide GPT (nf4's groups)
refused tpq "base = \"nf4\": h.0.attn.c_proj.weight's rows are 32 weights on each of" \
  --set parallel.tp=2 --set lora.base=nf4
refused z2 "use zero = 1 to shard their master and moments, or 3" --set parallel.zero=2
run nf4 -- "${lora[@]}" --set lora.base=nf4
run nf4z3 "${mpi[@]}" -- "${lora[@]}" --set lora.base=nf4 --set parallel.zero=3 \
  --set train.micro_batch_size=2
refused int4 'lora.base.*expected one of' --set lora.base=int4
"$keel" ckpt verify "$tmp/single" >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; exit 1; }
for name in single tp dora doratp; do  # tp 2's cut adapters (and magnitudes) come back whole
  "$keel" ckpt export "$(ls -d "$tmp/$name"/checkpoints/step_* | tail -1)" --adapter \
    --out "$tmp/$name-peft" >/dev/null
done

adapters=$(sed -n 's/.*: \([0-9]*\) adapter parameters trained.*/\1/p' "$tmp/single.log")
/usr/bin/python3 - "$tmp" "$adapters" <<'PY'
import json, struct, sys
d, adapters = sys.argv[1], int(sys.argv[2])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl")]
def close(label, name, ref, steps=12, limit=1e-5):
    """Run `name`'s losses within `limit` (relative) of `ref`'s, over all `steps` steps."""
    got = losses(name)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"{label}: max relative loss difference over {steps} steps {worst:.2e} (limit {limit:g})")
    assert len(got) == steps and worst <= limit, name
ref = losses("single")
assert len(ref) == 12, len(ref)
for name in ("dp", "dp0", "pp", "tp", "tpsp"):
    close(name, name, ref)
assert losses("resumed") == ref, "the resumed run's losses differ"
assert losses("tpr") == losses("tp"), "the resumed tp 2 run's losses differ"
drop = losses("drop")
assert len(drop) == 12 and drop != ref, "dropout changed nothing"
for name in ("dropdp", "droppp", "droptp"):
    close(f"dropout 0.3, {name[4:]}", name, drop)
assert losses("dropr") == drop, "the resumed dropout run's losses differ"
close("Llama (grouped-query attention), all targets, tp 2", "llamatp", losses("llama"), steps=8)
int8 = losses("int8")
close("int8 base, from the unquantized base", "int8", ref, limit=1e-3)
# 1e-7: tp's fp32 runs land within 1e-8; each shard's own row scale (the bug this guards)
# measured 2.9e-6 here, under the other checks' 1e-5.
close("int8 base, tp 2 (rows cut by columns take the whole row's scale)", "int8tp", int8,
      limit=1e-7)
# ZeRO 3 shards the frozen base (and a quantized one's codes and scales) and gathers it a block at
# a time: the products see the same weights as at ZeRO 1, whose adapters' state it shares.
assert losses("z3") == losses("dp"), "ZeRO 3's losses differ from ZeRO 1's"
assert losses("z3r") == losses("dp"), "stopped at ZeRO 1, resumed at ZeRO 3: the losses differ"
# The frozen embeddings and final norm are gathered once: an update regathers the blocks alone.
sent = [json.loads(l)["comm_bytes"] for l in open(f"{d}/z3/metrics.jsonl")]
print(f"ZeRO 3 bytes sent a step: {sent[0]:.0f} at step 1, {sent[1]:.0f} after")
assert len(set(sent[1:])) == 1 and sent[1] < sent[0], sent
close("int8 base, dp 2 ZeRO 3", "int8z3", int8)
close("nf4 base (random weights), dp 2 ZeRO 3", "nf4z3", losses("nf4"), steps=8)
def base_mib(name):  # the memory line's working copy and quantized base, MiB per rank
    line = next(l for l in open(f"{d}/{name}.log") if "memory per rank" in l)
    kinds = dict(kv.rsplit(" ", 1) for kv in line.split("(MiB): ")[1].split(";")[0].split(", "))
    return float(kinds["working"]) + float(kinds.get("quantized_base", 0))
for one, three in (("dp", "z3"), ("int8", "int8z3")):
    w1, w3 = base_mib(one), base_mib(three)
    print(f"frozen base per rank: {one} {w1:.4f} MiB, {three} (dp 2 ZeRO 3) {w3:.4f} MiB")
    assert w3 <= 0.51 * w1, (one, w1, three, w3)
assert losses("int8r") == int8, "the resumed int8 run's losses differ"
close("fp16, from fp32", "f16", ref, limit=1e-4)
close("fp16 on an int8 base, from fp32's int8 run", "f16int8", int8, limit=1e-4)
assert losses("f16r") == losses("f16"), "the resumed fp16 run's losses differ"
close("random base, pp 2", "randpp", losses("rand"), steps=8)
assert losses("randq") == losses("randq1"), "the resumed int8 run from random weights differs"
dora = losses("dora")
assert len(dora) == 12 and dora != ref, "DoRA changed nothing"
for name in ("doradp", "dorapp", "doratp", "doratpsp"):
    close(f"DoRA, {name[4:]}", name, dora)
assert losses("dorar") == dora, "the resumed DoRA run's losses differ"
close("DoRA on an int8 base, from the unquantized base", "doraint8", dora, limit=1e-3)
for name in ("randdorapp", "randdoratp"):
    close(f"DoRA from random weights, {name[8:]} 2", name, losses("randdora"), steps=8)
dd = losses("dd")
assert len(dd) == 12 and dd != dora, "DoRA's dropout changed nothing"
for name in ("dddp", "ddpp", "ddtp", "ddtp0"):
    close(f"DoRA with dropout 0.3, {name[2:]}", name, dd)
assert losses("ddr") == dd, "the resumed DoRA run with dropout differs"
assert losses("ddz3") == losses("dddp"), "DoRA with dropout at ZeRO 3 differs from ZeRO 1"
# The base streamed from a keel file (every run above) is the one read whole from an HF file.
assert losses("hfgpt2") == ref, "LoRA from the HF GPT-2 file differs from the keel file's"
assert losses("hfdora") == dora, "DoRA from the HF GPT-2 file differs from the keel file's"
llamafile = losses("llamafile")
assert len(llamafile) == 8 and losses("llamahf") == llamafile, "HF Llama folder != keel file"
close("DoRA on a Llama read from an HF folder, tp 2", "llamahftp", llamafile, steps=8)
close("DoRA on a grouped-query Llama, tp 2", "llamadoratp", losses("llamadora"), steps=8)
sent = {json.loads(l)["comm_bytes"] for l in open(f"{d}/dp0/metrics.jsonl")}
print(f"dp 2 ZeRO 0: {sorted(sent)} bytes sent per step for {adapters} adapter parameters")
assert sent == {4.0 * adapters}, f"expected {4 * adapters} bytes a step (the adapters only)"
with open(f"{d}/single/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
assert names and not any("lora" in k for k in names), "the model file holds adapter tensors"
import glob
last = sorted(glob.glob(f"{d}/single/checkpoints/step_*"))[-1]
man = json.load(open(f"{last}/manifest.json"))
held = {t["name"] for t in man["tensors"]}
kinds = {t["kind"] for t in man["tensors"]}
assert held and all(".lora_" in n for n in held), sorted(held)[:5]
assert kinds == {"master", "adam_m", "adam_v"}, kinds
assert man["state"]["base"]["init_from"].endswith("base/model.safetensors"), man["state"]["base"]
print(f"checkpoint: {len(held)} adapter tensors ({sorted(kinds)}), base {man['state']['base']['init_from']}")
print(f"losses {ref[0]:.4f} -> {ref[-1]:.4f}; model file: {len(names)} tensors, merged")
import numpy as np
def safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    return {k: np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in head.items() if k != "__metadata__"}
for a, b in (("single", "tp"), ("dora", "doratp")):
    one, two = (safetensors(f"{d}/{n}-peft/adapter_model.safetensors") for n in (a, b))
    assert one.keys() == two.keys() and all(one[k].shape == two[k].shape for k in one)
    assert (a == "dora") == any(k.endswith("lora_magnitude_vector") for k in one)
    worst = max(float(np.abs(one[k] - two[k]).max()) for k in one)
    print(f"PEFT export of the {b} 2 checkpoint: {len(one)} tensors, within {worst:.1e} of one "
          f"process's (1e-4)")
    assert worst <= 1e-4
PY
