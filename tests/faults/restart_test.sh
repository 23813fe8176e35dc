#!/usr/bin/env bash
# Restart on one node: `cohort launch --max-restarts 2` runs `cohort train` on 2 ranks with a
# checkpoint every 3 steps; once the first checkpoint is written, one rank is killed (SIGKILL).
# The launcher must stop the other rank and start both again (generation 1); cohort train must
# resume from its checkpoint by itself and finish, with the weights of a run that was never
# interrupted (bit for bit: the resume is exact); the launcher's and the run's logs and the JSON
# log state the restart and the time it lost.
set -uo pipefail
bin=${COHORT_BIN:?COHORT_BIN names the cohort binary}
dir=$(mktemp -d /tmp/cohort-restart.XXXXXX)
lpid=
# On a failure: the launcher (timeout's child) first, whose ranks die with it (PDEATHSIG).
trap '[ -n "$lpid" ] && { pkill -9 -P $lpid; kill -9 $lpid; } 2>/dev/null; rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
"$bin" make-dataset scans --out "$dir/scans" --count 96 --size 64 > /dev/null || fail "make-dataset"
train=(train --model resnet18 --data "$dir/scans" --epochs 2 --batch 4 --image-size 64 --lr 0.01
  --threads 1 --seed 3 --log-every 1)

ref=$(timeout 300 "$bin" launch --nproc-per-node 2 -- "$bin" "${train[@]}" --save "$dir/ref" 2>&1) ||
  fail "the uninterrupted run: $(tail -5 <<< "$ref")"

timeout 300 "$bin" launch --nproc-per-node 2 --max-restarts 2 -- "$bin" "${train[@]}" \
  --checkpoint-dir "$dir/ck" --checkpoint-every 3 --save "$dir/got" --json "$dir/got.json" \
  > "$dir/out.txt" 2>&1 &
lpid=$!
for _ in $(seq 1 1200); do
  [ -f "$dir/ck/checkpoint.json" ] && break
  sleep 0.05
done
[ -f "$dir/ck/checkpoint.json" ] || fail "no checkpoint within 60 s: $(tail -5 "$dir/out.txt")"
launcher=$(pgrep -P $lpid | head -1)  # $lpid is timeout's
victim=$(pgrep -P "$launcher" | head -1)
[ -n "$victim" ] || fail "no rank to kill (the run ended before the first checkpoint was seen?)"
kill -9 "$victim"
wait $lpid
code=$?
lpid=
out=$(cat "$dir/out.txt")
[ $code -eq 0 ] || fail "exit $code after the restart: $(tail -8 <<< "$out")"
grep -q "cohort launch: restart 1 of 2 (generation 1): rank [01] (pid $victim) was killed by signal 9" <<< "$out" ||
  fail "the launcher does not state the restart and whom it lost: $(grep 'cohort launch' <<< "$out")"
grep -q "train: restart: generation 1, 2 rank(s), resuming from $dir/ck" <<< "$out" ||
  fail "the run does not say it resumes: $(grep -m3 'restart' <<< "$out")"
grep -q "train: resumed from $dir/ck at step [1-9]" <<< "$out" || fail "no resume from the checkpoint"
grep -q "train: restart: generation 1 resumed at step [0-9]*; [0-9.]* s from the failure" <<< "$out" ||
  fail "the time the restart lost is not stated"
lost=$(grep -o '"lost_seconds": *[0-9.e+-]*' "$dir/got.json" | grep -o '[0-9.e+-]*$')
[ -n "$lost" ] || fail "the JSON log has no restart record"
awk -v l="$lost" 'BEGIN { exit !(l > 0 && l < 120) }' || fail "lost_seconds $lost"
cmp -s "$dir/ref/model.safetensors" "$dir/got/model.safetensors" ||
  fail "the restarted run's weights differ from the uninterrupted run's"
[ -z "$(ls /dev/shm | grep '^cohort-' || true)" ] || fail "shared-memory segments left: $(ls /dev/shm)"
echo "restarted after rank pid $victim was killed; $lost s lost; weights identical"
