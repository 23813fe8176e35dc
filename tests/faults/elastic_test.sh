#!/usr/bin/env bash
# Restarts across hosts (tools/netns-cluster, 2 emulated hosts x 2 ranks), `cohort train` with a
# checkpoint every 3 steps under `cohort launch --max-restarts 2`, each host writing to a folder
# of its own (no shared file system; each host also keeps a copy of the other's files):
#  1. --nnodes 2: a rank on host 1 is SIGKILLed; both launchers stop their ranks, form
#     generation 1 together, and the run resumes and ends with the weights of an uninterrupted
#     2 x 2 run, bit for bit.
#  2. --nnodes 1:2: host 1's launcher is SIGKILLed and started again at once with an empty
#     folder (the host comes back with a new disk); it joins generation 1, fetches the checkpoint
#     from host 0: the same world, the same bits.
#  3. --nnodes 1:2: host 1's launcher is SIGKILLed for good; host 0 goes on alone in
#     generation 1 with 2 ranks; accumulation 1 -> 2 keeps the global batch of 16, each rank
#     taking the batches of two old ranks in turn, and the run ends with the parameters of the
#     uninterrupted run within 1e-5 (relative). They are equal here: the old world's
#     hierarchical allreduce also added (0+1)+(2+3), and halving is exact.
#  4. --nnodes 1:2: host 1's launcher gets SIGTERM: both launchers stop, naming it; no restart.
#  5. --nnodes 1:2: host 0's launcher, the rendezvous store's, is SIGKILLed for good and its
#     folder removed: host 1 takes the store over and finishes alone as in 3, from the copy of
#     host 0's files in its own folder.
#  6. As 5, with --master listing both hosts, and host 0's launcher started again once host 1
#     leads (its host came back): it finds the job at host 1 instead of opening one of its own,
#     waits to be admitted, and leaves when the job ends, which host 1 finishes alone.
# Every launcher must end by itself; none of their processes, namespaces or segments is left.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COHORT_BIN:-$root/build/bin/cohort}
cluster=$root/tools/netns-cluster
name=elastic$$
dir=$(mktemp -d /tmp/cohort-elastic.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do pkill -9 -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  "$cluster" down --name "$name"
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
ip netns add "$name-probe" 2>/dev/null || fail "cannot create network namespaces here (needs root and iproute2)"
ip netns del "$name-probe"
"$cluster" up --nodes 2 --name "$name" > /dev/null || fail "cluster up"
master=$("$cluster" addr 0 --name "$name")
"$bin" make-dataset scans --out "$dir/scans" --count 96 --size 64 > /dev/null || fail "make-dataset"
train=(train --model resnet18 --data "$dir/scans" --epochs 2 --batch 4 --image-size 64 --lr 0.01
  --threads 1 --seed 3 --log-every 1)

# launcher NODE TAG PORT NNODES ARGS...: starts host NODE's launcher in the background.
launcher() {
  local node=$1 tag=$2 port=$3 nnodes=$4
  shift 4
  COHORT_HOST_ID=node$node COHORT_TIMEOUT=8 "$cluster" run "$node" --name "$name" -- \
    timeout 240 "$bin" launch --nproc-per-node 2 --nnodes "$nnodes" --node-rank "$node" \
    --master "${masters:-$master:$port}" --job-id "$tag" --grace 2 --max-restarts 2 --rdzv-last-call 2 \
    --rdzv-timeout 60 -- "$bin" "${train[@]}" "$@" >> "$dir/${log:-$tag}.$node.log" 2>&1 &
  pids[$node]=$!
}
# The launcher's pid (timeout's child) and one of its ranks.
launcher_pid() { pgrep -P "${pids[$1]}" | head -1; }
wait_checkpoint() {  # $1: checkpoint dir
  for _ in $(seq 1 1200); do
    [ -f "$1/checkpoint.json" ] && return 0
    sleep 0.05
  done
  fail "no checkpoint in $1 within 60 s: $(tail -3 "$dir"/*.log)"
}
wait_both() {
  codes=()
  for i in 0 1; do
    wait "${pids[$i]}" 2>/dev/null
    codes[$i]=$?
  done
  pids=()
}

cat > "$dir/distance.py" << 'EOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        # Parameters only: the running statistics are rank 0's, which sees 2 micro-batches a step.
        if k == "__metadata__" or v["dtype"] != "F32" or "running" in k:
            continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
num = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k])) ** 0.5
den = sum(x * x for k in a for x in a[k]) ** 0.5
print("relative distance of the parameters to the uninterrupted run's: %.2e" % (num / den))
sys.exit(0 if num / den < 1e-5 else 1)
EOF
# finished_alone NODE GONE TAG GOT: host NODE went on alone after host GONE left, kept the global
# batch, and ended with the uninterrupted run's parameters (GOT: its --save folder).
finished_alone() {
  local node=$1 gone=$2 log=$dir/$3.$1.log
  [ "${codes[$node]}" = 0 ] || fail "host $node alone exited ${codes[$node]}: $(tail -8 "$log")"
  grep -q "generation 1: nodes $node (1 of 1..2, 2 ranks); node(s) $gone left" "$log" ||
    fail "the launcher does not say host $gone left: $(grep 'cohort launch' "$log")"
  grep -q "train: restart: world 4 -> 2: accumulation 1 -> 2 keeps the global batch of 16" "$log" ||
    fail "the run does not keep the global batch: $(grep 'restart' "$log")"
  grep -q "train: restart: generation 1 resumed at step" "$log" || fail "no resumed step"
  /usr/bin/python3 "$dir/distance.py" "$dir/ref/model.safetensors" "$4/model.safetensors" ||
    fail "host $node alone: weights too far from the uninterrupted run's"
}

# The uninterrupted run on the same 2 x 2 layout (the allreduce order depends on it).
launcher 0 ref 29711 2 --save "$dir/ref"
launcher 1 ref 29711 2
wait_both
[ "${codes[*]}" = "0 0" ] || fail "the uninterrupted run exited ${codes[*]}: $(tail -5 "$dir"/ref.*.log)"

# 1. A rank of host 1 killed.
launcher 0 kill 29712 2 --checkpoint-dir "$dir/ck1/host0" --checkpoint-every 3 --save "$dir/got1"
launcher 1 kill 29712 2 --checkpoint-dir "$dir/ck1/host1" --checkpoint-every 3
wait_checkpoint "$dir/ck1/host0"
victim=$(pgrep -P "$(launcher_pid 1)" | head -1)
[ -n "$victim" ] || fail "no rank on host 1 to kill"
kill -9 "$victim"
wait_both
[ "${codes[*]}" = "0 0" ] || fail "after a killed rank the launchers exited ${codes[*]}: $(tail -5 "$dir"/kill.*.log)"
grep -q "restart 1 of 2 (generation 1): node 1: rank [23] (pid $victim) was killed by signal 9" "$dir/kill.0.log" ||
  fail "host 0's launcher does not name the killed rank: $(grep 'cohort launch' "$dir/kill.0.log")"
grep -q "generation 1: nodes 0,1 (2 of 2..2, 4 ranks)" "$dir/kill.1.log" || fail "no generation 1 on host 1"
grep -q "train: resumed from $dir/ck1/host0 at step [1-9]" "$dir/kill.0.log" || fail "no resume: $(grep -m3 train: "$dir/kill.0.log")"
cmp -s "$dir/ref/model.safetensors" "$dir/got1/model.safetensors" ||
  fail "after a killed rank the weights differ from the uninterrupted run's"
echo "PASS: a rank of host 1 killed: restarted on both hosts, weights identical"

# 2. Host 1's launcher killed and started again at once.
launcher 0 back 29713 1:2 --checkpoint-dir "$dir/ck2/host0" --checkpoint-every 3 --save "$dir/got2"
launcher 1 back 29713 1:2 --checkpoint-dir "$dir/ck2/host1" --checkpoint-every 3
wait_checkpoint "$dir/ck2/host1"
lp=$(launcher_pid 1)
kill -9 "$lp"
wait "${pids[1]}" 2>/dev/null
rm -rf "$dir/ck2/host1"  # it comes back with an empty disk
launcher 1 back 29713 1:2 --checkpoint-dir "$dir/ck2/host1" --checkpoint-every 3
wait_both
[ "${codes[*]}" = "0 0" ] || fail "after host 1 came back the launchers exited ${codes[*]}: $(tail -5 "$dir"/back.*.log)"
grep -q "generation 1: nodes 0,1 (2 of 1..2, 4 ranks)" "$dir/back.0.log" ||
  fail "host 1 did not rejoin in generation 1: $(grep 'cohort launch' "$dir/back.0.log")"
grep -q "train: checkpoint at step [1-9]*: 1 file(s) (.* MB) that a host lacked" "$dir/back.0.log" ||
  fail "host 1's empty folder was not given the checkpoint: $(grep -m3 'train:.*checkpoint' "$dir/back.0.log")"
[ -f "$dir/ck2/host1/checkpoint.json" ] || fail "host 1's folder has no checkpoint after the restart"
cmp -s "$dir/ref/model.safetensors" "$dir/got2/model.safetensors" ||
  fail "after host 1 came back the weights differ from the uninterrupted run's"
echo "PASS: host 1's launcher killed and started again with an empty disk: it rejoined, fetched the checkpoint, weights identical"

# 3. Host 1's launcher killed for good: host 0 goes on alone.
launcher 0 shrink 29714 1:2 --checkpoint-dir "$dir/ck3/host0" --checkpoint-every 3 --save "$dir/got3" \
  --json "$dir/got3.json"
launcher 1 shrink 29714 1:2 --checkpoint-dir "$dir/ck3/host1" --checkpoint-every 3
wait_checkpoint "$dir/ck3/host1"
kill -9 "$(launcher_pid 1)"
rm -rf "$dir/ck3/host1"  # host 1 is gone with its disk
wait_both
finished_alone 0 1 shrink "$dir/got3"
echo "PASS: host 1 lost for good: host 0 finished alone with accumulation 2"

# 5. Host 0's launcher (the rendezvous store's) killed for good: host 1 takes the store over and
#    goes on alone, from its own folder (which holds a copy of host 0's files).
launcher 0 lead 29716 1:2 --checkpoint-dir "$dir/ck5/host0" --checkpoint-every 3
launcher 1 lead 29716 1:2 --checkpoint-dir "$dir/ck5/host1" --checkpoint-every 3 --save "$dir/got5"
wait_checkpoint "$dir/ck5/host1"
kill -9 "$(launcher_pid 0)"
rm -rf "$dir/ck5/host0"  # host 0 is gone with its disk
wait_both
finished_alone 1 0 lead "$dir/got5"
grep -q "node 0's launcher is gone (its rendezvous store at .* refuses connections); this node hosts the rendezvous now" "$dir/lead.1.log" ||
  fail "host 1 did not take the rendezvous over: $(grep 'cohort launch' "$dir/lead.1.log")"
echo "PASS: host 0 (the rendezvous store's) lost for good: host 1 took the store over and finished alone"
# 6. Host 0's launcher killed, then started again once host 1 leads: it joins host 1's job.
#    Longer than the others (6 epochs), so that the job is still on when host 0 comes back.
masters="$master:29717,$("$cluster" addr 1 --name "$name"):29717"
saved=("${train[@]}")
[ "${train[5]}" = "--epochs" ] || fail "the test's train arguments moved: ${train[*]}"
train[6]=6
launcher 0 late 29717 1:2 --checkpoint-dir "$dir/ck6/host0" --checkpoint-every 3
launcher 1 late 29717 1:2 --checkpoint-dir "$dir/ck6/host1" --checkpoint-every 3
wait_checkpoint "$dir/ck6/host1"
kill -9 "$(launcher_pid 0)"
wait "${pids[0]}" 2>/dev/null
rm -rf "$dir/ck6/host0"
for _ in $(seq 1 600); do
  grep -q "generation 1: nodes 1 (1 of 1..2, 2 ranks)" "$dir/late.1.log" && break
  sleep 0.1
done
grep -q "generation 1: nodes 1 (1 of 1..2, 2 ranks)" "$dir/late.1.log" ||
  fail "host 1 did not go on alone: $(grep 'cohort launch' "$dir/late.1.log")"
log=late-back launcher 0 late 29717 1:2 --checkpoint-dir "$dir/ck6/host0" --checkpoint-every 3
wait_both
[ "${codes[*]}" = "0 0" ] || fail "host 0 back and host 1 exited ${codes[*]}: $(tail -5 "$dir"/late.*.log)"
grep -q "node 0: the job's rendezvous is at node 1 (.*:29717) since a failover; joining it there" "$dir/late-back.0.log" ||
  fail "host 0 did not find the job at host 1: $(cat "$dir/late-back.0.log")"
grep -q "node 0: the job ended (ok) before a generation took this node" "$dir/late-back.0.log" ||
  fail "host 0 did not wait in host 1's job: $(cat "$dir/late-back.0.log")"
grep -q "\[rank" "$dir/late-back.0.log" && fail "host 0 started ranks of its own: $(head -5 "$dir/late-back.0.log")"
grep -q "train: restart: generation 1 resumed at step" "$dir/late.1.log" || fail "host 1 did not resume"
unset masters
train=("${saved[@]}")
echo "PASS: host 0 lost, then started again: it found the job at host 1 and waited there until the end"
# 4. Host 1's launcher asked to stop (SIGTERM): the job stops on both hosts, without a restart.
launcher 0 stop 29715 1:2 --checkpoint-dir "$dir/ck4/host0" --checkpoint-every 3
launcher 1 stop 29715 1:2 --checkpoint-dir "$dir/ck4/host1" --checkpoint-every 3
wait_checkpoint "$dir/ck4/host0"
kill -TERM "$(launcher_pid 1)"
wait_both
[ "${codes[0]}" != 0 ] && [ "${codes[1]}" != 0 ] || fail "after a SIGTERM the launchers exited ${codes[*]}"
grep -q "cohort launch: job failed: node 1: interrupted by signal 15" "$dir/stop.0.log" ||
  fail "host 0 does not stop for host 1's SIGTERM: $(grep 'cohort launch' "$dir/stop.0.log")"
grep -q "restart 1 of" "$dir"/stop.*.log && fail "a SIGTERM led to a restart"
echo "PASS: host 1's launcher stopped by SIGTERM: the job stopped on both hosts"
leftover=$(ls /dev/shm | grep '^cohort-' || true)
[ -z "$leftover" ] || fail "shared-memory segments left: $leftover"
echo "6 passed, 0 failed"
