#!/usr/bin/env python3
"""The Python `safetensors` package reads scmoe's checkpoints and finds exactly the tensors we wrote.

    check_safetensors.py <scmoe_safetensors_fixture> <work dir>

Runs the fixture to write <work dir>/single.safetensors and a 2-shard checkpoint with its index, then
reads them with safetensors (safe_open for metadata and numpy tensors, deserialize for the raw bytes of
every dtype, bf16 included since numpy has none). Values follow write_safetensors_fixture.cpp: element i
of the k-th tensor is i * 0.25 - 3 + k (floats; bf16 = top 16 bits of the f32), 3 * i - 7 + k (ints),
(37 * i + k) % 256 (U8). Exits 77 (ctest: skipped) when safetensors or numpy cannot be imported:
    pip install safetensors numpy
"""
import json
import os
import shutil
import subprocess
import sys

SKIP = 77

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # the skip names what is missing
    print(f"SKIP: cannot import the Python safetensors package ({e}); pip install safetensors numpy")
    sys.exit(SKIP)

# name, dtype, shape, shard: the same list, in the same order, as kTensors in the fixture.
TENSORS = [
    ("embed", "F32", [3, 4], 0),
    ("layers.0.gate_w", "BF16", [2, 5], 0),
    ("layers.0.expert_w1.rank0", "BF16", [2, 3, 4], 0),
    ("layers.0.expert_w1.rank1", "BF16", [2, 3, 4], 1),
    ("tokens", "I32", [7], 1),
    ("counts", "I64", [2, 2], 1),
    ("mask", "U8", [5], 1),
    ("scale", "F64", [], 0),
    ("empty", "F32", [0, 3], 1),
]
METADATA = {"config": '{"hidden": 64, "num_experts": 8, "ep_size": 2}', "step": "100", "world_size": "2"}
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
CRC_KEY = "scmoe.data_crc32"


def expected(k, dtype, shape):
    """The tensor as numpy would hold it; bf16 as its uint16 bit patterns."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    v = i * 0.25 - 3 + k
    if dtype == "F32":
        a = v.astype(np.float32)
    elif dtype == "F64":
        a = v.astype(np.float64)
    elif dtype == "BF16":
        a = (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    elif dtype == "I32":
        a = (3 * i - 7 + k).astype(np.int32)
    elif dtype == "I64":
        a = (3 * i - 7 + k).astype(np.int64)
    elif dtype == "U8":
        a = ((37 * i + k) % 256).astype(np.uint8)
    else:
        raise ValueError(dtype)
    return a.reshape(shape)


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("MISMATCH:", what)


def check_file(path, tensors, metadata):
    """tensors: [(k, name, dtype, shape)] that `path` must hold, and nothing else."""
    with safe_open(path, framework="np") as f:
        meta = f.metadata() or {}
        check(CRC_KEY in meta, f"{path}: metadata lacks {CRC_KEY}")
        meta.pop(CRC_KEY, None)
        check(meta == metadata, f"{path}: metadata {meta} != {metadata}")
        check(sorted(f.keys()) == sorted(t[1] for t in tensors), f"{path}: tensor names {sorted(f.keys())}")
        for k, name, dtype, shape in tensors:
            if dtype == "BF16":  # numpy has no bf16: checked below through the raw bytes
                continue
            got = f.get_tensor(name)
            want = expected(k, dtype, shape)
            check(got.dtype == want.dtype and list(got.shape) == shape and np.array_equal(got, want),
                  f"{path}: {name}: got {got.dtype} {list(got.shape)} {got.ravel()[:8]}, "
                  f"want {want.dtype} {shape} {want.ravel()[:8]}")
    with open(path, "rb") as fh:
        raw = dict(safetensors.deserialize(fh.read()))
    for k, name, dtype, shape in tensors:
        info = raw[name]
        want = expected(k, dtype, shape)
        check(info["dtype"].upper() == dtype and list(info["shape"]) == shape,
              f"{path}: {name}: header says {info['dtype']} {info['shape']}, want {dtype} {shape}")
        check(bytes(info["data"]) == want.astype(want.dtype.newbyteorder("<")).tobytes(),
              f"{path}: {name}: bytes differ")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    fixture, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    subprocess.run([fixture, work], check=True)
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")

    indexed = [(k, name, dtype, shape) for k, (name, dtype, shape, _) in enumerate(TENSORS)]
    check_file(os.path.join(work, "single.safetensors"), indexed, METADATA)

    with open(os.path.join(work, "model.safetensors.index.json")) as fh:
        index = json.load(fh)
    check(index["metadata"] == METADATA, f"index metadata {index['metadata']}")
    check(index["weight_map"] == {name: SHARDS[shard] for name, _, _, shard in TENSORS},
          f"index weight_map {index['weight_map']}")
    for r, shard in enumerate(SHARDS):
        held = [(k, name, dtype, shape) for k, (name, dtype, shape, s) in enumerate(TENSORS) if s == r]
        check_file(os.path.join(work, shard), held, dict(METADATA, rank=str(r)))

    leftovers = [n for n in os.listdir(work) if ".tmp." in n]
    check(not leftovers, f"temp files left behind: {leftovers}")
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print(f"OK: {len(TENSORS)} tensors, in one file and in 2 shards, equal as read by the safetensors package")
    return 0


if __name__ == "__main__":
    sys.exit(main())
