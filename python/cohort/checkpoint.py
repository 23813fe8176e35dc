"""Read-only views of Cohort's files from Python: safetensors weights (what `cohort train --save`
writes, in torchvision's names) and sharded checkpoints (`--checkpoint-dir`). Pure Python over the
formats (docs/training.md): nothing here loads a model or writes a file.

    from cohort.checkpoint import load_safetensors, inspect
    model.load_state_dict(load_safetensors("out/model.safetensors"))
    print(inspect("out/checkpoint")["step"])
"""
import json
import os
import struct

import torch

__all__ = ["load_safetensors", "inspect"]

_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def load_safetensors(path):
    """Every tensor of a safetensors file, by name (CPU tensors owning their memory)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: the header claims {n} bytes; the file has {len(raw) - 8}")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: the header is not JSON: {e}") from None
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {meta.get('dtype')!r}")
        lo, hi = meta["data_offsets"]
        if not 0 <= lo <= hi <= len(data):
            raise ValueError(f"{path}: tensor {name} lies at [{lo}, {hi}) beyond the data "
                             f"({len(data)} bytes)")
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=dtype) if hi > lo else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"])
    return out


def inspect(directory):
    """A checkpoint directory's index (step, epoch, position, world, mode, model, files, ...),
    with each file's size; raises naming the file when the index is missing or damaged."""
    index = os.path.join(directory, "checkpoint.json")
    try:
        with open(index) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{index}: no checkpoint index (an unfinished or empty "
                                "checkpoint directory)") from None
    except ValueError as e:
        raise ValueError(f"{index}: not JSON: {e}") from None
    if not str(info.get("format", "")).startswith("cohort-checkpoint"):
        raise ValueError(f"{index}: format {info.get('format')!r} is not a Cohort checkpoint")
    for entry in info.get("files", []):
        path = os.path.join(directory, entry["path"])
        entry["bytes"] = os.path.getsize(path) if os.path.exists(path) else None
    return info
