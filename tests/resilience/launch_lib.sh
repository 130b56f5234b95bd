# shellcheck shell=bash disable=SC2154 # $tmp and $sup are the sourcing script's
# Shared by the keel launch tests (launch_local.sh, tests/cluster/launch_*.sh): sourced after
# $tmp is set. A run NAME logs to $tmp/NAME.log and keeps its run folder in $tmp/NAME; the
# supervisor runs in the background with its pid in $sup.
#   finish NAME WANT_RC             waits for the supervisor; its exit code must be WANT_RC
#   beat NAME RANK MIN_STEP FIELD   waits until RANK's heartbeat passed MIN_STEP; prints FIELD
#   expect NAME TEXT                the log holds TEXT
#   supervisor_events NAME EVENT    how many EVENT records the supervisor wrote (with "attempt")

finish() {
  local rc=0
  wait "$sup" || rc=$?
  ((rc == $2)) || { echo "$1: keel launch exit $rc, expected $2"; cat "$tmp/$1.log"; exit 1; }
}

beat() {
  local f
  f=$tmp/$1/heartbeat/$(printf 'rank_%05d.json' "$2")
  for _ in $(seq 900); do
    if [[ -f $f ]] && /usr/bin/python3 -c "import json,sys; b=json.load(open('$f')); sys.exit(0 if b['step'] >= $3 and 'exit_code' not in b else 1)" 2>/dev/null; then
      /usr/bin/python3 -c "import json; print(json.load(open('$f'))['$4'])"
      return
    fi
    sleep 0.1
  done
  echo "$1: rank $2 never reached step $3"; cat "$tmp/$1.log"; exit 1
}

expect() {
  grep -q -F -- "$2" "$tmp/$1.log" || { echo "$1: no \"$2\" in the log:"; cat "$tmp/$1.log"; exit 1; }
}

supervisor_events() {
  /usr/bin/python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if (j := json.loads(l)).get('event') == sys.argv[2] and 'attempt' in j))" "$tmp/$1/events.jsonl" "$2"
}
