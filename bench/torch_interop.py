#!/usr/bin/python3
"""Weights across the border with torchvision, both ways.
  MODEL WEIGHTS IO: loads Cohort's safetensors weights into the torchvision model of the same name
    (strict) and checks it gives Cohort's outputs; IO holds x (input) and y (Cohort's eval-mode
    output). Exit 0 when they agree.
  MODEL --export WEIGHTS IO: builds the torchvision model (seeded, with a few training steps'
    worth of BatchNorm statistics), writes its state_dict to WEIGHTS as safetensors and its
    eval-mode output on IO's x into IO as y, for Cohort to load and compare."""
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


TORCH_CODES = {v: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": TORCH_CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def build(name, in_ch, classes):
    model = getattr(torchvision.models, name)(num_classes=classes)
    conv = model.conv1 if name.startswith("resnet") else model.features.conv0
    if in_ch != conv.in_channels:
        new = torch.nn.Conv2d(in_ch, conv.out_channels, conv.kernel_size, conv.stride,
                              conv.padding, bias=False)
        if name.startswith("resnet"):
            model.conv1 = new
        else:
            model.features.conv0 = new
    return model


def export(name, weights, io):
    x = read_safetensors(io)["x"]
    torch.manual_seed(3)
    model = build(name, x.shape[1], 3)
    model.train()
    with torch.no_grad():
        model(torch.randn(4, *x.shape[1:]))  # running statistics away from their defaults
    model.eval()
    with torch.no_grad():
        y = model(x)
    write_safetensors(weights, dict(model.state_dict()))
    write_safetensors(io, {"x": x, "y": y})


def main():
    if sys.argv[2] == "--export":
        export(sys.argv[1], sys.argv[3], sys.argv[4])
        return
    name, weights, io = sys.argv[1:4]
    state = read_safetensors(weights)
    tensors = read_safetensors(io)
    x, y = tensors["x"], tensors["y"]
    model = build(name, x.shape[1], y.shape[1])
    stem = "conv1" if name.startswith("resnet") else "features.conv0"
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
