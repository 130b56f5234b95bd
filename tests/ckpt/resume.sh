#!/usr/bin/env bash
# Exact resume and resharding, end to end through `keel train`:
#  1. bitwise: 40 steps straight against 20 steps (stop_at) + --resume auto to 40, in fp32 and
#     bf16, with 1 and 2 ranks: every step's loss and the final parameters are bitwise equal;
#  2. resharding: saved by 2 ranks, resumed by 1 and by 3; saved by 1 and by 3, resumed by 2: the losses
#     of steps 21-40 follow the uninterrupted run to 1e-5 relative and the data position in the
#     checkpoint is exactly 20 global batches;
#  3. across ZeRO layouts: saved at dp 4 ZeRO-3 after 10 steps, resumed at (dp 2, ZeRO-1),
#     (dp 1, ZeRO-0) and (dp 3, ZeRO-2): steps 11-40 within 1e-6 relative of the uninterrupted
#     run; and at dp 2 ZeRO-3 a stop and resume is bitwise;
#  4. incremental: with the embeddings frozen, later checkpoints reference their unchanged bytes
#     in the first one (which retention then keeps) and a resume from them is still bitwise;
#  5. a Llama (llama-tiny): stop and resume at 2 ranks ZeRO-1 in bf16 is bitwise, saved by 2
#     ranks and resumed by 1 follows the uninterrupted run; a GPT-2 checkpoint resumed with a
#     Llama config is refused (exit 2) naming model.family.
#   tests/ckpt/resume.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set train.batch_size=12 --set optim.lr=3e-3 --set train.log_every=10
        --set train.sample_count=0 --set checkpoint.every_minutes=0)

# run NAME NP [args...]: one `keel train` with NP ranks (1 = no mpirun), output in NAME.log.
run() {
  local name=$1 np=$2
  shift 2
  local cmd=("$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name="$name" "$@")
  if ((np > 1)); then
    cmd=(mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 "${cmd[@]}")
  fi
  OMP_NUM_THREADS=1 "${cmd[@]}" >>"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}

for prec in fp32 bf16; do
  for np in 1 2; do
    run "full_${prec}_$np" "$np" --set train.precision=$prec
    run "cut_${prec}_$np" "$np" --set train.precision=$prec --set train.stop_at=20
    run "cut_${prec}_$np" "$np" --set train.precision=$prec --resume auto
    grep -q "resuming from .*step_00000020" "$tmp/cut_${prec}_$np.log" ||
      { echo "cut_${prec}_$np did not resume from step 20"; cat "$tmp/cut_${prec}_$np.log"; exit 1; }
    cmp "$tmp/full_${prec}_$np/model.safetensors" "$tmp/cut_${prec}_$np/model.safetensors" ||
      { echo "$prec np=$np: final parameters differ after resume"; exit 1; }
  done
done

# Resharding: 2 -> 1, 2 -> 3, 1 -> 2 (fp32).
run saved2 2 --set train.precision=fp32 --set train.stop_at=20
for np in 1 3; do
  cp -r "$tmp/saved2" "$tmp/from2to$np"
  rm -f "$tmp/from2to$np.log"
  run "from2to$np" "$np" --set train.precision=fp32 --resume auto
done
run saved1 1 --set train.precision=fp32 --set train.stop_at=20
cp -r "$tmp/saved1" "$tmp/from1to2"
run from1to2 2 --set train.precision=fp32 --resume auto
run saved3 3 --set train.precision=fp32 --set train.stop_at=20
cp -r "$tmp/saved3" "$tmp/from3to2"
run from3to2 2 --set train.precision=fp32 --resume auto

# Across ZeRO layouts: each rank saved only its shard; any layout reads the slices it needs.
run z3dp4 4 --set train.precision=fp32 --set parallel.zero=3 --set train.stop_at=10
for to in "2 1" "1 0" "3 2"; do
  read -r dp z <<<"$to"
  cp -r "$tmp/z3dp4" "$tmp/z3to_dp${dp}_z$z"
  rm -f "$tmp/z3to_dp${dp}_z$z.log"
  run "z3to_dp${dp}_z$z" "$dp" --set train.precision=fp32 --set parallel.zero="$z" --resume auto
done
run full_z3_2 2 --set train.precision=fp32 --set parallel.zero=3
run cut_z3_2 2 --set train.precision=fp32 --set parallel.zero=3 --set train.stop_at=20
run cut_z3_2 2 --set train.precision=fp32 --set parallel.zero=3 --resume auto
cmp "$tmp/full_z3_2/model.safetensors" "$tmp/cut_z3_2/model.safetensors" ||
  { echo "ZeRO-3 dp 2: final parameters differ after resume"; exit 1; }

# Incremental saves: embeddings frozen, a save every 5 steps, only the newest kept.
inc=(--set train.precision=fp32 --set optim.freeze="wte.*,wpe.*" --set checkpoint.every_steps=5
     --set checkpoint.keep_last=1)
run inc_full 1 "${inc[@]}"
run inc_cut 1 "${inc[@]}" --set train.stop_at=20
run inc_cut 1 "${inc[@]}" --resume auto
cmp "$tmp/inc_full/model.safetensors" "$tmp/inc_cut/model.safetensors" ||
  { echo "incremental: final parameters differ after resume"; exit 1; }
"$keel" ckpt verify "$tmp/inc_cut" >"$tmp/inc_verify.log" 2>&1 || { cat "$tmp/inc_verify.log"; exit 1; }
# Across the restart too: step 40 (written after the resume) still points into step 5.
grep -q '"file": "../step_00000005/rank_00000.bin"' "$tmp/inc_cut/checkpoints/step_00000040/manifest.json" ||
  { echo "incremental: step 40 does not reference step 5"; exit 1; }
[[ -d "$tmp/inc_cut/checkpoints/step_00000005" ]] || { echo "incremental: referenced step 5 deleted"; exit 1; }
grep -o '"referenced_bytes":[0-9]*' "$tmp/inc_cut/events.jsonl" | tail -1 | sed 's/^/incremental: step 40 /'

llama=(--set model.name=llama-tiny --set train.precision=bf16 --set parallel.zero=1)
run llama_full 2 "${llama[@]}"
run llama_cut 2 "${llama[@]}" --set train.stop_at=20
run llama_cut 2 "${llama[@]}" --resume auto
cmp "$tmp/llama_full/model.safetensors" "$tmp/llama_cut/model.safetensors" ||
  { echo "llama: final parameters differ after resume"; exit 1; }
run llama_ref32 1 --set model.name=llama-tiny
run llama_saved2 2 --set model.name=llama-tiny --set train.stop_at=20
cp -r "$tmp/llama_saved2" "$tmp/llama_from2to1"
rm -f "$tmp/llama_from2to1.log"
run llama_from2to1 1 --set model.name=llama-tiny --resume auto
cp -r "$tmp/saved1" "$tmp/gpt2_as_llama"
rc=0
"$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=gpt2_as_llama \
  --set model.name=llama-tiny --resume auto >"$tmp/gpt2_as_llama.log" 2>&1 || rc=$?
((rc == 2)) && grep -q "model.family = gpt2 there, llama in this run" "$tmp/gpt2_as_llama.log" ||
  { echo "a GPT-2 checkpoint resumed as a Llama: exit $rc, expected 2 naming model.family:"
    cat "$tmp/gpt2_as_llama.log"; exit 1; }
echo "gpt2 checkpoint, llama config: refused: $(grep -m1 family "$tmp/gpt2_as_llama.log")"

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl")]
bad = 0
for prec in ("fp32", "bf16"):
    for np in (1, 2):
        full, cut = losses(f"full_{prec}_{np}"), losses(f"cut_{prec}_{np}")
        same = full == cut and len(full) == 40
        print(f"{prec} np={np}: 40 steps straight vs 20 + resume: "
              f"{'bitwise identical' if same else 'DIFFERENT'} losses and parameters")
        bad |= not same
ref = losses("full_fp32_1")
for name in ("from2to1", "from2to3", "from1to2", "from3to2"):
    got = losses(name)
    if len(got) != 40:
        print(f"{name}: {len(got)} steps, expected 40"); bad = 1; continue
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[20:], ref[20:]))
    print(f"{name}: steps 21-40 vs the uninterrupted run: max relative difference {worst:.1e} (limit 1e-5)")
    bad |= worst > 1e-5
for name in ("z3to_dp2_z1", "z3to_dp1_z0", "z3to_dp3_z2"):
    got = losses(name)
    if len(got) != 40:
        print(f"{name}: {len(got)} steps, expected 40"); bad = 1; continue
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[10:], ref[10:]))
    print(f"{name}: saved at dp 4 ZeRO-3, steps 11-40 vs the uninterrupted run: max relative "
          f"difference {worst:.1e} (limit 1e-6)")
    bad |= worst > 1e-6
same = losses("full_z3_2") == losses("cut_z3_2")
print(f"ZeRO-3 dp 2: 40 steps straight vs 20 + resume: {'bitwise identical' if same else 'DIFFERENT'}")
bad |= not same
m = json.load(open(f"{d}/z3dp4/checkpoints/step_00000010/manifest.json"))
print(f"z3dp4: manifest layout {m['state']['layout']}")
bad |= m["state"]["layout"] != {"dp": 4, "tp": 1, "pp": 1, "zero": 3}
for name in ("saved2", "saved1", "saved3"):
    m = json.load(open(f"{d}/{name}/checkpoints/step_00000020/manifest.json"))
    pos = m["state"]["loader"]["position"]
    print(f"{name}: data position in the checkpoint {pos} (expected 20 x 12 = 240)")
    bad |= pos != 240
same = losses("llama_full") == losses("llama_cut") and len(losses("llama_full")) == 40
print(f"llama bf16 dp 2 ZeRO-1: 40 steps straight vs 20 + resume: "
      f"{'bitwise identical' if same else 'DIFFERENT'}")
bad |= not same
got, ref = losses("llama_from2to1"), losses("llama_ref32")
worst = max(abs(a - b) / abs(b) for a, b in zip(got[20:], ref[20:])) if len(got) == 40 else 1
print(f"llama_from2to1: steps 21-40 vs the uninterrupted run: max relative difference "
      f"{worst:.1e} (limit 1e-5)")
bad |= worst > 1e-5
sys.exit(bad)
PY
