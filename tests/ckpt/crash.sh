#!/usr/bin/env bash
# Nothing lost (DESIGN.md invariant 4), through `keel train` and `keel ckpt`:
#  1. SIGKILL at every phase of a save (KEEL_CKPT_CRASH_AT) and at 20 random instants while a
#     save is always in flight: afterwards `latest` names a checkpoint that verifies, and
#     `--resume auto` continues from a committed one;
#  2. a flipped byte in the newest checkpoint: verify names the tensor and file and fails,
#     resume falls back to the previous checkpoint and says so in events.jsonl;
#  3. a full disk (a 40 MiB tmpfs): the save fails with a clear message, training goes on, the
#     older checkpoints stay intact, the run ends with exit code 1 and its model file written;
#  4. an edited manifest given to --resume PATH: one line, exit code 2.
#   tests/ckpt/crash.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
mnt=""
cleanup() {
  [[ -n "$mnt" ]] && umount "$mnt" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
export OMP_NUM_THREADS=1
train=("$keel" train "$src/configs/test-tiny.toml" --set data.train="$tmp/tokens.u16"
       --set train.out_dir="$tmp" --set train.log_every=1000 --set train.sample_count=0
       --set checkpoint.every_minutes=0 --set checkpoint.keep_last=2)
fail() { echo "FAIL: $*"; exit 1; }

# After a crash: `latest` (if any) names a checkpoint that verifies; --resume auto continues from
# a committed checkpoint (or from 0 if none was ever committed) and finishes.
check_recovers() {
  local name=$1 why=$2 root="$tmp/$1/checkpoints"
  if [[ -f "$root/latest" ]]; then
    "$keel" ckpt verify "$root/$(cat "$root/latest")" >"$tmp/verify.log" 2>&1 ||
      { cat "$tmp/verify.log"; fail "$why: latest names a checkpoint that does not verify"; }
  fi
  local newest
  # None committed yet (killed during start-up or the first save) is a case, not an error.
  newest=$(ls "$root" 2>/dev/null | grep '^step_[0-9]*$' | tail -1 | sed 's/^step_0*//' || true)
  "${train[@]}" --set train.name="$name" --set train.steps=100000 \
    --set train.stop_at=$((${newest:-0} + 3)) --resume auto \
    >"$tmp/resume.log" 2>&1 || { cat "$tmp/resume.log"; fail "$why: --resume auto failed"; }
  "$keel" ckpt verify "$tmp/$name" >"$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log"; fail "$why: a checkpoint does not verify after the resumed run"; }
}

# 1a. Every phase of the third save (retention: the first deletion).
for phase in snapshot write written manifest commit rename latest retention:1; do
  name="phase_${phase%%:*}"
  spec=$phase
  [[ $phase == *:* ]] || spec="$phase:3"
  set +e
  KEEL_CKPT_CRASH_AT=$spec "${train[@]}" --set train.name="$name" --set train.steps=12 \
    --set checkpoint.every_steps=2 >"$tmp/$name.log" 2>&1
  rc=$?
  set -e
  ((rc == 137)) || { cat "$tmp/$name.log"; fail "$phase: expected a SIGKILL (137), got $rc"; }
  committed=$(ls "$tmp/$name/checkpoints" | grep -c '^step_[0-9]*$' || true)
  ((committed >= 2)) || fail "$phase: $committed committed checkpoints left, expected >= 2"
  latest=$(cat "$tmp/$name/checkpoints/latest" 2>/dev/null || echo none)
  check_recovers "$name" "kill at $phase"
  resumed=$(sed -n 's|.*resuming from .*/\(step_[0-9]*\).*|\1|p' "$tmp/resume.log")
  case $phase in
    write | written | manifest | commit)  # the cut save's folder is there, and said to be ignored
      grep -q "ignoring .*step_00000006.tmp: a save that never committed" "$tmp/resume.log" ||
        { cat "$tmp/resume.log"; fail "$phase: the incomplete step_00000006.tmp was not reported"; } ;;
  esac
  echo "killed at $phase: $committed committed left, latest $latest, resumed from $resumed"
done

# 1b. Random instants: a save at every step, so most instants fall inside one.
during=0
for i in $(seq 20); do
  name="random_$i"
  "${train[@]}" --set train.name="$name" --set train.steps=100000 \
    --set checkpoint.every_steps=1 >"$tmp/$name.log" 2>&1 &
  pid=$!
  sleep "$(awk -v s="$i" 'BEGIN { srand(s); printf "%.3f", 0.4 + 1.2 * rand() }')"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  compgen -G "$tmp/$name/checkpoints/step_*.tmp" >/dev/null && during=$((during + 1))
  check_recovers "$name" "random kill $i"
done
echo "20 random SIGKILLs ($during left a save half-done): latest always verified, --resume auto always continued"

# 2. A flipped byte in the newest committed checkpoint.
"${train[@]}" --set train.name=flip --set train.steps=6 --set checkpoint.every_steps=2 \
  >"$tmp/flip.log" 2>&1 || { cat "$tmp/flip.log"; fail "flip: training failed"; }
bin="$tmp/flip/checkpoints/step_00000006/rank_00000.bin"
printf '\xff' | dd of="$bin" bs=1 seek=1000 conv=notrunc status=none
set +e
"$keel" ckpt verify "$tmp/flip" >"$tmp/flip_verify.log" 2>&1
rc=$?
set -e
((rc == 2)) || { cat "$tmp/flip_verify.log"; fail "verify of a corrupt checkpoint exited $rc"; }
grep -q "wte.weight (master) in rank_00000.bin.*xxh3" "$tmp/flip_verify.log" ||
  { cat "$tmp/flip_verify.log"; fail "verify did not name the tensor and file"; }
"${train[@]}" --set train.name=flip --set train.steps=8 --resume auto >"$tmp/flip_resume.log" 2>&1 ||
  { cat "$tmp/flip_resume.log"; fail "resume after corruption failed"; }
grep -q "skipping checkpoint .*step_00000006" "$tmp/flip_resume.log" ||
  fail "resume did not report the corrupt checkpoint"
grep -q "resuming from .*step_00000004" "$tmp/flip_resume.log" ||
  { cat "$tmp/flip_resume.log"; fail "resume did not fall back to step 4"; }
grep -q '"event":"checkpoint_rejected"' "$tmp/flip/events.jsonl" ||
  fail "events.jsonl has no checkpoint_rejected"
echo "flipped byte: verify named wte.weight in rank_00000.bin; resume fell back to step_00000004"

# 3. A full disk: 40 MiB holds two 18.7 MiB checkpoints, not a third.
mnt="$tmp/small"
mkdir -p "$mnt"
mount -t tmpfs -o size=40m tmpfs "$mnt" || fail "cannot mount a tmpfs for the disk-full test (needs root)"
set +e
"${train[@]}" --set train.name=full --set train.steps=20 --set checkpoint.every_steps=5 \
  --set checkpoint.keep_last=5 --set checkpoint.dir="$mnt/ck" >"$tmp/full.log" 2>&1
rc=$?
set -e
((rc == 1)) || { cat "$tmp/full.log"; fail "disk full: expected exit code 1, got $rc"; }
grep -q "checkpoint of step 15 failed: .*No space left on device" "$tmp/full.log" ||
  { cat "$tmp/full.log"; fail "disk full: no clear message"; }
[[ $(wc -l <"$tmp/full/metrics.jsonl") == 20 ]] || fail "disk full: training did not go on to step 20"
[[ -f "$tmp/full/model.safetensors" ]] || fail "disk full: the model file was not written"
"$keel" ckpt verify "$mnt/ck" >"$tmp/full_verify.log" 2>&1 ||
  { cat "$tmp/full_verify.log"; fail "disk full: older checkpoints damaged"; }
[[ "$(ls "$mnt/ck")" == "$(printf 'latest\nstep_00000005\nstep_00000010')" ]] ||
  { ls -la "$mnt/ck"; fail "disk full: unexpected files left"; }
echo "disk full: step 15 and 20 failed cleanly, step 5 and 10 verify, exit code 1, model file written"

# 4. An edited manifest: COMMIT no longer matches it. (Each malformed-manifest case has its own
#    line in tests/ckpt/ckpt_store_test.cc.)
dir="$tmp/flip/checkpoints/step_00000008"
printf '{"format": "keel-checkpoint", "version": 1, "step": "four"}' >"$dir/manifest.json"
set +e
"${train[@]}" --set train.name=flip --set train.steps=8 --resume "$dir" >"$tmp/bad.log" 2>&1
rc=$?
set -e
((rc == 2)) || { cat "$tmp/bad.log"; fail "edited manifest: expected exit 2, got $rc"; }
grep -q "step_00000008/manifest.json: xxh3 .* does not match COMMIT" "$tmp/bad.log" ||
  { cat "$tmp/bad.log"; fail "edited manifest: no clear line"; }
echo "edited manifest: one line, exit 2"
