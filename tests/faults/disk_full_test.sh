#!/usr/bin/env bash
# A full disk under the checkpoint folder. The folder is a 300 KiB tmpfs, mounted in a mount
# namespace of this test's own (gone with it). It holds one checkpoint of the small CNN, but not
# a second one beside it. `cohort train` on 2 ranks must:
# - stop with an error that names the file and says the disk is full, on every rank, without a
#   crash or a hang;
# - leave the previous checkpoint whole: `cohort checkpoint inspect` reads it, and `--resume`
#   continues from it on a disk with room.
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
