#!/usr/bin/env bash
# A checkpoint folder that turns read-only, and one that vanishes, while `cohort train` runs on
# 2 ranks and writes a checkpoint every 2 steps. A watcher waits for the first checkpoint's index
# and then acts, so the change lands between two checkpoints or during one.
# - Read-only: the folder is a tmpfs in a mount namespace of this test's own, remounted
#   read-only. The run must stop with an error that names a file in the folder and says the file
#   system is read-only, without a crash or a hang; the checkpoint the folder holds must be whole:
#   `cohort checkpoint inspect` reads it and `--resume` finishes from it.
# - Vanished: the folder is removed. The run must not crash or hang: either it makes the folder
#   again and finishes, its last checkpoint whole there, or (the folder going during a write) it
#   stops with an error that names the folder and says what it still holds.
set -uo pipefail
bin=${COHORT_BIN:?COHORT_BIN names the cohort binary}
dir=$(mktemp -d /tmp/cohort-ckfolder.XXXXXX)
watcher=
trap '[ -z "$watcher" ] || kill "$watcher" 2>/dev/null; rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
"$bin" make-dataset scans --out "$dir/scans" --count 64 --size 24 > /dev/null || fail "make-dataset"
steps=160
train=(train --model smallcnn --data "$dir/scans" --epochs 40 --batch 8 --image-size 24
       --checkpoint-every 2)
# Waits (at most 60 s) for $1/checkpoint.json, then runs the rest until it succeeds (at most
# 500 tries, 10 ms apart).
after_first_checkpoint() {
  local ck=$1
  shift
  for _ in $(seq 600); do
    [ -e "$ck/checkpoint.json" ] && break
    sleep 0.1
  done
  for _ in $(seq 500); do
    "$@" 2> /dev/null && return 0
    sleep 0.01
  done
  return 1
}
export -f after_first_checkpoint

# 1. Read-only.
mkdir "$dir/ck"
out=$(timeout 180 unshare --mount --propagation private bash -c '
  dir=$1 bin=$2; shift 2
  mount -t tmpfs -o size=64m tmpfs "$dir/ck" || exit 99
  after_first_checkpoint "$dir/ck" mount -o remount,ro "$dir/ck" &
  watcher=$!
  "$bin" launch --nproc-per-node 2 -- "$bin" "$@" --checkpoint-dir "$dir/ck"
  code=$?
  wait $watcher || echo "the watcher never made the folder read-only"
  cp -r "$dir/ck" "$dir/kept"  # what the read-only folder holds, for the checks outside
  exit $code' bash "$dir" "$bin" "${train[@]}" 2>&1)
code=$?
echo "$out" | tail -6
[ $code -ne 99 ] || fail "cannot mount a tmpfs in a mount namespace (needs root)"
grep -q "the watcher never" <<< "$out" && fail "the folder was not made read-only"
[ $code -ne 0 ] || fail "training went on with its checkpoints unwritten"
[ $code -lt 124 ] || fail "exit $code: a hang or a crash"
grep -q "Read-only file system" <<< "$out" || fail "the error does not say the folder is read-only"
grep -q "$dir/ck/" <<< "$out" || fail "the error does not name the file"
grep -q "$dir/ck keeps the previous checkpoint" <<< "$out" ||
  fail "the error does not say the previous checkpoint stays"
inspect=$("$bin" checkpoint inspect "$dir/kept" 2>&1) || fail "the kept checkpoint does not read: $inspect"
kept_step=$(sed -n 's/.* step \([0-9]*\).*/\1/p' <<< "$inspect" | head -1)
[ -n "$kept_step" ] && [ "$kept_step" -ge 2 ] && [ "$kept_step" -lt $steps ] ||
  fail "the kept checkpoint's step is '$kept_step': $inspect"
resumed=$(timeout 180 "$bin" launch --nproc-per-node 2 -- "$bin" "${train[@]}" --resume "$dir/kept" \
  --checkpoint-dir "$dir/ck2" 2>&1) || fail "resuming from the kept checkpoint: $(tail -5 <<< "$resumed")"
grep -q "step $steps/$steps" <<< "$resumed" || fail "the resumed run did not finish: $(tail -5 <<< "$resumed")"
echo "PASS: read-only folder: clear error, the checkpoint of step $kept_step kept and resumable"

# 2. Vanished.
mkdir "$dir/ck3"
after_first_checkpoint "$dir/ck3" rm -r "$dir/ck3" &
watcher=$!
out=$(timeout 180 "$bin" launch --nproc-per-node 2 -- "$bin" "${train[@]}" \
  --checkpoint-dir "$dir/ck3" 2>&1)
code=$?
wait $watcher || fail "the watcher never removed the folder"
echo "$out" | tail -4
[ $code -lt 124 ] || fail "exit $code: a hang or a crash"
if [ $code -eq 0 ]; then
  inspect=$("$bin" checkpoint inspect "$dir/ck3" 2>&1) || fail "no checkpoint after the folder vanished: $inspect"
  grep -q "step $steps\b" <<< "$inspect" || fail "the last checkpoint is not step $steps: $inspect"
  echo "PASS: vanished folder: made again, the last checkpoint whole"
else
  # What the folder holds when the error is written: the removal may not have reached the index.
  grep -Eq "$dir/ck3 (holds no checkpoint any more|keeps the previous checkpoint)" <<< "$out" ||
    fail "exit $code without naming the folder and what it holds"
  echo "PASS: vanished folder: a clear error naming it"
fi
