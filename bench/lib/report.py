"""Shared by the comparison scripts in bench/: what machine the figures came from, medians and
spreads over alternating rounds, and one JSON file of the raw runs, configuration and summary."""
import json
import os
import platform
import re
import statistics
import subprocess


def machine(root="."):
    """ISA features, cores, memory and one core's memcpy bandwidth, as seen now."""
    flags, model = "", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags") and not flags:
                flags = line
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    isa = [x for x in ("sse4_2", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16",
                       "amx_tile", "amx_bf16") if re.search(r"\b%s\b" % x, flags)]
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    m = {"cpu": model, "isa": isa, "cores": os.cpu_count(), "memory_bytes": mem,
         "kernel": platform.release()}
    # A cap on the ISA that oneDNN (Cohort's and PyTorch's) may use, e.g. AVX2 on a machine with
    # AVX-512: the figures are then the capped path's, not the machine's best.
    caps = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if k in os.environ}
    if caps:
        m["isa_cap"] = caps
    bw = os.path.join(root, "build/bin/memcpy_bw")
    if os.access(bw, os.X_OK):
        m["memcpy_gbps"] = float(subprocess.run([bw], capture_output=True, text=True).stdout)
    return m


def spread(values):
    """Median, min and max of a list of numbers (NaN-free)."""
    v = [x for x in values if x == x]
    if not v:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(s, digits=3):
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def write(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
