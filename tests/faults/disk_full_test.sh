#!/usr/bin/env bash
# A full disk under the checkpoint folder. The folder is a 300 KiB tmpfs, mounted in a mount
# namespace of this test's own (gone with it). It holds one checkpoint of the small CNN, but not
# a second one beside it. `cohort train` on 2 ranks must:
# - stop with an error that names the file and says the disk is full, on every rank, without a
#   crash or a hang;
# - leave the previous checkpoint whole: `cohort checkpoint inspect` reads it, and `--resume`
#   continues from it on a disk with room.
# Then two hosts (COHORT_HOST_ID, over loopback), each with a folder of its own, where host 1's
# is a 20 MiB tmpfs: too small for its copy of rank 0's ResNet-18 file (89 MB), which arrives
# in 8 MiB pieces. Host 1's rank must name the copy it could not keep and the full disk, and
# every rank stop, none left waiting for pieces that host 1 no longer takes.
set -uo pipefail
bin=${COHORT_BIN:?COHORT_BIN names the cohort binary}
dir=$(mktemp -d /tmp/cohort-diskfull.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
"$bin" make-dataset scans --out "$dir/scans" --count 64 --size 24 > /dev/null || fail "make-dataset"
mkdir "$dir/ck"
train=(train --model smallcnn --data "$dir/scans" --epochs 2 --batch 8 --image-size 24)
out=$(timeout 120 unshare --mount --propagation private bash -c '
  dir=$1 bin=$2; shift 2
  mount -t tmpfs -o size=300k tmpfs "$dir/ck" || exit 99
  "$bin" launch --nproc-per-node 2 -- "$bin" "$@" --checkpoint-every 2 --checkpoint-dir "$dir/ck"
  code=$?
  cp -r "$dir/ck" "$dir/kept"  # what the full disk holds, for the checks outside
  exit $code' bash "$dir" "$bin" "${train[@]}" 2>&1)
code=$?
echo "$out" | tail -8
[ $code -ne 99 ] || fail "cannot mount a tmpfs in a mount namespace (needs root)"
[ $code -ne 0 ] || fail "training went on with its checkpoint unwritten"
[ $code -lt 124 ] || fail "exit $code: a hang or a crash"
grep -q "No space left on device" <<< "$out" || fail "the error does not say the disk is full"
grep -q "$dir/ck/step-4-[0-9]*/rank-0.safetensors" <<< "$out" || fail "the error does not name the file"
grep -q "keeps the previous checkpoint" <<< "$out" || fail "the error does not say the previous checkpoint stays"
grep -q "checkpoint at step 2 written" <<< "$out" || fail "the first checkpoint was not written"

inspect=$("$bin" checkpoint inspect "$dir/kept" 2>&1) || fail "the kept checkpoint does not read: $inspect"
grep -q "step 2" <<< "$inspect" || fail "the kept checkpoint is not step 2: $inspect"
resumed=$(timeout 120 "$bin" launch --nproc-per-node 2 -- "$bin" "${train[@]}" --resume "$dir/kept" \
  --checkpoint-dir "$dir/ck2" 2>&1) || fail "resuming from the kept checkpoint: $(tail -5 <<< "$resumed")"
grep -q "epoch 2/2 step 8/8" <<< "$resumed" || fail "the resumed run did not finish: $(tail -5 <<< "$resumed")"
echo "PASS: full disk: clear error, previous checkpoint kept and resumable"

"$bin" make-dataset scans --out "$dir/scans32" --count 32 --size 32 > /dev/null || fail "make-dataset"
mkdir -p "$dir/two/host0" "$dir/two/host1"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(timeout 150 unshare --mount --propagation private bash -c '
  dir=$1 bin=$2 port=$3; shift 3
  mount -t tmpfs -o size=20m tmpfs "$dir/two/host1" || exit 99
  export COHORT_JOB_TOKEN=diskfull-$port
  # Each launcher bounded by itself (it stops its ranks on the signal), inside the outer bound.
  for h in 1 0; do
    COHORT_HOST_ID=host$h timeout 120 "$bin" launch --nproc-per-node 2 --nnodes 2 --node-rank $h \
      --master 127.0.0.1:$port -- "$bin" "$@" --checkpoint-dir "$dir/two/host$h" \
      > "$dir/two.$h.log" 2>&1 &
    pids[$h]=$!
  done
  wait ${pids[0]}; c0=$?; wait ${pids[1]}; c1=$?
  echo "exit $c0 $c1"
  [ $c0 -ne 0 ] && [ $c1 -ne 0 ] && [ $c0 -lt 124 ] && [ $c1 -lt 124 ]' bash "$dir" "$bin" "$port" \
  train --model resnet18 --data "$dir/scans32" --epochs 1 --batch 4 --image-size 32 --threads 1 \
  --checkpoint-every 1 2>&1)
code=$?
[ $code -ne 99 ] || fail "cannot mount a tmpfs in a mount namespace (needs root)"
[ $code -eq 0 ] || fail "two hosts, host 1's disk full: $out (each launcher must stop by itself with an error): $(tail -4 "$dir"/two.*.log)"
grep -q "rank [23] could not keep the copy of rank 0's shard: .*writing .*/two/host1/step-1-[0-9]*/rank-0.safetensors.*No space left on device" "$dir/two.1.log" ||
  fail "host 1 does not name the copy it could not keep and the full disk: $(grep -m3 'checkpoint' "$dir/two.1.log")"
grep -q "two/host1 holds no checkpoint yet (this was its first)" "$dir/two.1.log" ||
  fail "host 1 does not say its folder holds no checkpoint yet: $(grep -m3 'checkpoint' "$dir/two.1.log")"
grep -q "checkpoint at step 1: a copy on another host failed" "$dir/two.0.log" ||
  fail "host 0 does not say a copy on another host failed: $(grep -m3 'checkpoint' "$dir/two.0.log")"
echo "PASS: host 1's disk full under its copy of a shard: every rank stopped, naming it"
