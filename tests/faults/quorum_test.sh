#!/usr/bin/env bash
# Node 0 goes silent in a job of 3 emulated hosts (tools/netns-cluster) x 1 rank: its link is
# cut for good after the first checkpoint, while its launcher and rank live on, cut off. A dead
# host and a cut link look the same from outside, so only a majority may replace the leader:
# - hosts 1 and 2 each lose node 0's rendezvous store, vote, see each other's vote (2 of the 3
#   nodes), and host 1 takes the rendezvous over; they form generation 1 without node 0, resume
#   from the checkpoint (host 0's files are kept on host 1) and finish;
# - node 0's launcher, leading a next generation that only it joins (1 of 3: a minority), does
#   not train on beside them: it stops at --rdzv-timeout, naming the minority.
# Every launcher must end by itself; no process, namespace or segment is left.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COHORT_BIN:-$root/build/bin/cohort}
cluster=$root/tools/netns-cluster
name=quorum$$
dir=$(mktemp -d /tmp/cohort-quorum.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do pkill -9 -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  "$cluster" down --name "$name"
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for i in 0 1 2; do echo "--- host $i:"; tail -6 "$dir/run.$i.log" 2>/dev/null; done
  exit 1
}
ip netns add "$name-probe" 2>/dev/null || fail "cannot create network namespaces here (needs root and iproute2)"
ip netns del "$name-probe"
"$cluster" up --nodes 3 --name "$name" > /dev/null || fail "cluster up"
master=$("$cluster" addr 0 --name "$name")
"$bin" make-dataset scans --out "$dir/scans" --count 96 --size 24 > /dev/null || fail "make-dataset"

for node in 0 1 2; do
  COHORT_HOST_ID=node$node COHORT_TIMEOUT=6 "$cluster" run "$node" --name "$name" -- \
    timeout 150 "$bin" launch --nproc-per-node 1 --nnodes 1:3 --node-rank "$node" \
    --master "$master:29731" --job-id quorum --grace 2 --max-restarts 2 --rdzv-last-call 2 \
    --rdzv-timeout 30 -- "$bin" train --model smallcnn --data "$dir/scans" --epochs 60 --batch 4 \
    --image-size 24 --seed 3 --checkpoint-every 3 --checkpoint-dir "$dir/ck/host$node" \
    > "$dir/run.$node.log" 2>&1 &
  pids[$node]=$!
done
for _ in $(seq 1 1200); do
  [ -f "$dir/ck/host0/checkpoint.json" ] && break
  sleep 0.05
done
[ -f "$dir/ck/host0/checkpoint.json" ] || fail "no checkpoint within 60 s"
cut_at=$(date +%s)
ip netns exec "$name-n0" ip link set eth0 down || fail "cannot cut host 0's link"

codes=()
for i in 0 1 2; do
  wait "${pids[$i]}" 2>/dev/null
  codes[$i]=$?
done
pids=()
took=$(($(date +%s) - cut_at))
echo "exits ${codes[*]}, $took s after the cut"
for i in 1 2; do
  [ "${codes[$i]}" = 0 ] || fail "host $i exited ${codes[$i]}"
done
grep -q "node 0's launcher is gone (its rendezvous store at $master:29731 is silent, and 2 of the last generation's 3 nodes (1,2) cannot reach it: a majority); this node hosts the rendezvous now" "$dir/run.1.log" ||
  fail "host 1 does not say it took over by a majority: $(grep 'cohort launch' "$dir/run.1.log")"
grep -q "node 1 hosts the rendezvous now" "$dir/run.2.log" ||
  fail "host 2 does not follow host 1: $(grep 'cohort launch' "$dir/run.2.log")"
grep -q "generation 1: nodes 1,2 (2 of 1..3, 2 ranks); node(s) 0 left" "$dir/run.1.log" ||
  fail "no generation of hosts 1 and 2: $(grep 'cohort launch' "$dir/run.1.log")"
grep -q "train: restart: generation 1 resumed at step" "$dir/run.1.log" || fail "no resumed step"
grep -q "epoch 60/60" "$dir/run.1.log" || fail "hosts 1 and 2 did not finish"
[ "${codes[0]}" != 0 ] || fail "node 0, cut off, trained on as a minority"
[ "${codes[0]}" -lt 124 ] || fail "node 0's launcher exit ${codes[0]}: a hang or a crash"
grep -q "a minority does not go on" "$dir/run.0.log" ||
  fail "node 0 does not say it is a minority: $(grep 'cohort' "$dir/run.0.log" | tail -3)"
[ "$took" -lt 120 ] || fail "$took s from the cut to the last launcher's end"
echo "PASS: node 0 silent: hosts 1 and 2 took over by a majority and finished; node 0 stopped as a minority"
