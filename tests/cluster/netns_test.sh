#!/usr/bin/env bash
# Emulated hosts (network namespaces, tools/netns-cluster):
#  1. 2 hosts x 2 ranks: a checked job across them completes and uses shared memory + TCP;
#  2. the same checked job over UCX (UCX_TLS=tcp,sm: tcp between hosts, shared memory inside);
#  3. cutting a node's link in the middle of a collective makes every rank fail within the
#     timeout and both launchers exit non-zero (an error, not a hang);
#  4. 2 hosts x 1 rank, 3 hosts x 1 and x 2 ranks, checked, over TCP and over UCX;
#  5. mpirun inside node 0 starting 2 ranks on each node through plm_rsh_agent
#     (netns-cluster rsh), the ranks running Cohort's own backend, then the mpi backend
#     (Open MPI's shared memory inside a node, its TCP between nodes).
# Fails where namespaces cannot be made. Always removes its namespaces.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COHORT_BIN:-$root/build/bin/cohort}
cluster=$root/tools/netns-cluster
name=ctest$$
if ! ip netns add "$name-probe" 2>/dev/null; then
  # The README promises the emulated cluster: it fails here, it never skips.
  echo "FAIL: cannot create network namespaces here (the test needs root and iproute2)"
  exit 1
fi
ip netns del "$name-probe"
cleanup() { "$cluster" down --name "$name"; }
trap cleanup EXIT
"$cluster" up --nodes 2 --name "$name" >/dev/null || { echo "FAIL: cluster up"; exit 1; }
master=$("$cluster" addr 0 --name "$name")
fail=0
out=$(mktemp -d)

run_job() {  # $1: port, $2: job id, rest: program
  local port=$1 id=$2
  shift 2
  for i in 0 1; do
    COHORT_HOST_ID=node$i COHORT_TIMEOUT=10 timeout 60 "$cluster" run $i --name "$name" -- \
      "$bin" launch --nproc-per-node 2 --nnodes 2 --node-rank $i --master "$master:$port" \
      --job-id "$id" --grace 2 -- "$@" > "$out/$id.$i.log" 2>&1 &
    pids[$i]=$!
  done
  codes=()
  for i in 0 1; do wait "${pids[$i]}"; codes[$i]=$?; done
}

# 1. A checked job across the two hosts.
run_job 29611 ok "$bin" bench comm --min-bytes 8 --max-bytes 4M --factor 16 --iters 3 --warmup 1 --check
if [ "${codes[0]}" -ne 0 ] || [ "${codes[1]}" -ne 0 ]; then
  echo "FAIL: job across two hosts exited ${codes[*]}"; cat "$out"/ok.*.log; fail=1
elif ! grep -q "4 ranks on 2 host(s), transports shm+tcp" "$out/ok.0.log" ||
     ! grep -q "Out of bounds values : 0 OK" "$out/ok.0.log"; then
  echo "FAIL: unexpected output"; cat "$out/ok.0.log"; fail=1
else
  echo "PASS: checked allreduce across two emulated hosts"
fi

# 2. UCX across the two hosts.
COHORT_TRANSPORT=ucx UCX_TLS=tcp,sm UCX_NET_DEVICES=eth0 \
  run_job 29613 ucx "$bin" bench comm --min-bytes 8 --max-bytes 4M --factor 16 --iters 3 --warmup 1 --check
if [ "${codes[0]}" -ne 0 ] || [ "${codes[1]}" -ne 0 ] ||
   ! grep -q "4 ranks on 2 host(s), transports ucx" "$out/ucx.0.log" ||
   ! grep -q "Out of bounds values : 0 OK" "$out/ucx.0.log"; then
  echo "FAIL: UCX job across two hosts exited ${codes[*]}"; cat "$out"/ucx.*.log; fail=1
else
  echo "PASS: checked allreduce over UCX across two emulated hosts"
fi

# 3. Cut node 1's link while large allreduces run; expect errors within the timeout, and only
# after the cut: the cutter waits until the job runs its collectives (rank 0's header is out),
# records what the logs held just before cutting, and the time of the cut.
(
  for _ in $(seq 200); do grep -q "# cohort bench comm" "$out/cut.0.log" 2>/dev/null && break; sleep 0.1; done
  sleep 2
  cat "$out"/cut.*.log > "$out/before-cut.txt" 2>/dev/null
  ip netns exec "$name-n1" ip link set eth0 down
  date +%s.%N > "$out/cut.at"
) &
cutter=$!
run_job 29612 cut "$bin" bench comm --min-bytes 64M --max-bytes 64M --iters 1000 --warmup 0
ended=$(date +%s.%N)
wait $cutter
took=$(python3 -c "print(round($ended - $(cat "$out/cut.at" 2>/dev/null || echo $ended), 1))")
if [ ! -s "$out/cut.at" ] || ! grep -q "# cohort bench comm" "$out/before-cut.txt" ||
   grep -qiE "error|failed|abort" "$out/before-cut.txt"; then
  echo "FAIL: the job was not running cleanly when the link was cut:"; cat "$out/before-cut.txt"
  tail -n 5 "$out"/cut.*.log; fail=1
elif [ "${codes[0]}" -eq 0 ] || [ "${codes[1]}" -eq 0 ] || [ "${codes[0]}" -eq 124 ] || [ "${codes[1]}" -eq 124 ]; then
  echo "FAIL: after the link cut the launchers exited ${codes[*]} (0: no error, 124: hung)"; fail=1
  tail -n 5 "$out"/cut.*.log
elif ! grep -qE "rank [0-9]+ \(host node[01]\)|no progress|closed its connection|timed out" "$out"/cut.*.log; then
  echo "FAIL: the errors do not name a rank or the timeout"; tail -n 5 "$out"/cut.*.log; fail=1
else
  echo "PASS: link cut while the job ran -> every launcher failed ${took}s after the cut"
fi
# 4. One rank on each of two hosts, then three hosts of one and of two ranks, over TCP and UCX.
port=29620
many() {  # $1: nodes, $2: ranks per node, $3: transport
  local nodes=$1 per=$2 transport=$3 label=h$1r$2$3 i
  port=$((port + 1))
  local pids=()
  for ((i = 0; i < nodes; i++)); do
    COHORT_TRANSPORT=$transport UCX_TLS=tcp,sm UCX_NET_DEVICES=eth0 COHORT_HOST_ID=node$i \
      COHORT_TIMEOUT=10 timeout 60 "$cluster" run $i --name "$name" -- "$bin" launch \
      --nproc-per-node $per --nnodes $nodes --node-rank $i --master "$master:$port" --job-id $label \
      -- "$bin" bench comm --min-bytes 8 --max-bytes 4M --factor 16 --iters 3 --warmup 1 --check \
      > "$out/$label.$i.log" 2>&1 &
    pids+=($!)
  done
  local bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  if [ $bad -ne 0 ] || ! grep -q "$((nodes * per)) ranks on $nodes host(s), transports" "$out/$label.0.log" ||
     ! grep -q "Out of bounds values : 0 OK" "$out/$label.0.log"; then
    echo "FAIL: $nodes hosts x $per ranks over $transport"; cat "$out"/$label.*.log; fail=1
  else
    echo "PASS: checked allreduce, $nodes emulated hosts x $per rank(s) over $transport"
  fi
}
"$cluster" down --name "$name"
"$cluster" up --nodes 2 --name "$name" >/dev/null || { echo "FAIL: cluster up (2)"; exit 1; }
master=$("$cluster" addr 0 --name "$name")
many 2 1 tcp
many 2 1 ucx
"$cluster" down --name "$name"
"$cluster" up --nodes 3 --name "$name" >/dev/null || { echo "FAIL: cluster up (3)"; exit 1; }
master=$("$cluster" addr 0 --name "$name")
for per in 1 2; do
  for transport in tcp ucx; do many 3 $per $transport; done
done

# 5. mpirun across the emulated nodes (each with its own hostname, so Open MPI tells them apart).
a0=$("$cluster" addr 0 --name "$name")
a1=$("$cluster" addr 1 --name "$name")
if command -v mpirun >/dev/null; then
  for backend in cohort mpi; do
    COHORT_BACKEND=$backend COHORT_HOST_ID=node0 COHORT_TIMEOUT=20 timeout 120 \
      "$cluster" run 0 --name "$name" -- mpirun --allow-run-as-root --oversubscribe \
      --host "$a0:2,$a1:2" -np 4 --mca plm_rsh_agent "$cluster rsh --name $name" \
      --mca btl self,vader,tcp --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 \
      -x MASTER_ADDR="$a0" -x COHORT_BACKEND -x COHORT_TIMEOUT \
      "$bin" bench comm --min-bytes 8 --max-bytes 1M --factor 16 --iters 3 --warmup 1 --check \
      > "$out/mpirun-$backend.log" 2>&1
    code=$?
    if [ $code -ne 0 ] || ! grep -q "4 ranks" "$out/mpirun-$backend.log" ||
       ! grep -q "Out of bounds values : 0 OK" "$out/mpirun-$backend.log" ||
       { [ $backend = cohort ] && ! grep -q "on 2 host(s), transports shm+tcp" "$out/mpirun-$backend.log"; } ||
       { [ $backend = mpi ] && ! grep -q "mpi backend: 4 ranks on 2 host(s)" "$out/mpirun-$backend.log"; }; then
      echo "FAIL: mpirun across nodes, $backend backend, exited $code"; cat "$out/mpirun-$backend.log"; fail=1
    else
      echo "PASS: mpirun across two emulated nodes, $backend backend"
    fi
  done
else
  echo "FAIL: mpirun not installed"; fail=1
fi
rm -rf "$out"
[ $fail -eq 0 ] && echo "11 passed, 0 failed" || echo "some of 11 failed"
exit $fail
