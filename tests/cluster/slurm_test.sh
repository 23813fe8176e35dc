#!/usr/bin/env bash
# A real single-host Slurm (Debian's slurm-wlm and munge, started here with a private config,
# state and munge socket under a temp dir, on loopback and free ports): `srun -n 4 cohort bench
# comm --check` and a data-parallel `srun -n 2 cohort train` find their place from SLURM_*
# with no launcher; each passes only when srun exits 0. Every daemon is stopped and the temp dir
# removed at exit. Where the daemons cannot run it fails, naming what is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${COHORT_BIN:-$root/build/bin/cohort}
# The README promises srun: a missing piece is a failure, never a skip (scripts/build installs
# slurm-wlm and munge).
missing() {
  echo "FAIL: $*"; exit 1
}
for p in slurmctld slurmd srun sinfo munged; do
  command -v $p >/dev/null || missing "$p not installed"
done
dir=$(mktemp -d /tmp/cohort-slurm.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
host=$(hostname -s)
read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
mkdir -p "$dir/spool" "$dir/state"
cat > "$dir/slurm.conf" <<CONF
ClusterName=cohorttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=cohort Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF=$dir/slurm.conf
munged --force -S "$dir/munge.sock" --pid-file="$dir/munged.pid" --seed-file="$dir/munge.seed" \
  > "$dir/munged.out" 2>&1 || missing "munged does not start: $(cat "$dir/munged.out")"
pids+=("$(cat "$dir/munged.pid")")
slurmctld -D -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$host" -f "$SLURM_CONF" > "$dir/slurmd.out" 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 100); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed"; then ready=1; break; fi
  sleep 0.2
done
if [ $ready -ne 1 ]; then
  tail -5 "$dir"/*.out "$dir"/*.log 2>/dev/null; missing "Slurm did not come up"
fi
pass=0 fail=0
out=$(timeout 120 srun -n 4 --overcommit "$bin" bench comm --min-bytes 8 --max-bytes 1M --factor 16 \
  --iters 3 --warmup 1 --check 2>&1)
code=$?
if [ $code -eq 0 ] && grep -q "4 ranks on 1 host(s)" <<< "$out" &&
   grep -q "Out of bounds values : 0 OK" <<< "$out"; then
  echo "PASS: srun -n 4 cohort bench comm"; pass=$((pass + 1))
else
  echo "FAIL: srun -n 4 cohort bench comm (exit $code)"; echo "$out" | tail -20; fail=$((fail + 1))
fi
"$bin" make-dataset scans --out "$dir/scans" --count 64 --size 24 > /dev/null 2>&1
out=$(timeout 120 srun -n 2 --overcommit "$bin" train --model smallcnn --data "$dir/scans" --epochs 2 \
  --batch 8 --image-size 24 --log-every 4 2>&1)
code=$?
if [ $code -eq 0 ] && grep -q "2 rank(s)" <<< "$out" && grep -q "DDP over" <<< "$out" &&
   grep -q "epoch 2/2 step 8/8" <<< "$out"; then
  echo "PASS: srun -n 2 cohort train (data parallel)"; pass=$((pass + 1))
else
  echo "FAIL: srun -n 2 cohort train (exit $code)"; echo "$out" | tail -20; fail=$((fail + 1))
fi
# A torch script on the torch.distributed backend "cohort" under srun: importing cohort fills in
# torch's RANK, WORLD_SIZE and MASTER_* from Slurm's variables.
py=$(dirname "$bin")/../python
out=$(PYTHONPATH=$py timeout 120 srun -n 2 --overcommit /usr/bin/python3 \
  "$(dirname "$0")/../python/launchers_rank.py" 2>&1)
code=$?
if [ $code -eq 0 ] && [ "$(echo "$out" | grep -c "allreduce 3")" -eq 2 ]; then
  echo "PASS: srun -n 2 python3 (torch.distributed backend cohort)"; pass=$((pass + 1))
else
  echo "FAIL: srun -n 2 python3 with the cohort backend (exit $code)"; echo "$out" | tail -20
  fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
