#!/usr/bin/python3
"""Loads Cohort's safetensors weights into the torchvision model of the same name (strict) and
checks that it gives Cohort's outputs on Cohort's inputs. Usage: MODEL WEIGHTS IO, where IO holds
tensors x (input) and y (Cohort's eval-mode output). Exit 0 when they agree."""
import json
import struct
import sys

import torch
import torchvision

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "U8": torch.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[b:end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]) if e["shape"] else t.reshape(())
    return out


def main():
    name, weights, io = sys.argv[1:4]
    state = read_safetensors(weights)
    tensors = read_safetensors(io)
    x, y = tensors["x"], tensors["y"]
    in_ch, classes = x.shape[1], y.shape[1]
    model = getattr(torchvision.models, name)(num_classes=classes)
    stem = "conv1" if name.startswith("resnet") else "features.conv0"
    conv = getattr(model, "conv1") if name.startswith("resnet") else model.features.conv0
    if in_ch != conv.in_channels:
        new = torch.nn.Conv2d(in_ch, conv.out_channels, conv.kernel_size, conv.stride,
                              conv.padding, bias=False)
        if name.startswith("resnet"):
            model.conv1 = new
        else:
            model.features.conv0 = new
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        ours = model(x)
    err = (ours - y).abs().max().item()
    scale = y.abs().max().item()
    print(f"{name}: max |torch - cohort| = {err:.3g} (outputs up to {scale:.3g}), stem {stem}")
    sys.exit(0 if err <= 1e-3 * max(1.0, scale) else 1)


if __name__ == "__main__":
    main()
