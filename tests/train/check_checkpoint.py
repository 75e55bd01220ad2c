"""Reads an scmoe-train checkpoint with the Python safetensors package and checks it against its
index, its config and the raw bytes of each file (parsed here independently of scmoe's reader).

usage: check_checkpoint.py CHECKPOINT_ROOT      exit 0 ok, 1 mismatch, 77 packages missing
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)


def raw_tensors(path):
    """The tensors of a safetensors file straight from its header and data section."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"])
    return out, header.get("__metadata__", {})


def main():
    root = sys.argv[1]
    step_dir = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
    state = json.load(open(os.path.join(step_dir, "trainer_state.json")))
    cfg = state["config"]
    index = json.load(open(os.path.join(step_dir, "model.safetensors.index.json")))
    H, V, S, E = cfg["hidden"], cfg["vocab"], cfg["seq_len"], cfg["experts"]
    seen = set()
    for file in sorted(set(index["weight_map"].values())):
        path = os.path.join(step_dir, file)
        tensors = load_file(path)
        raw, meta = raw_tensors(path)
        assert meta["step"] == str(state["step"]), (file, meta["step"], state["step"])
        assert set(tensors) == set(raw), file
        for name, t in tensors.items():
            assert index["weight_map"][name] == file, (name, file)
            assert t.dtype == np.float32 and np.array_equal(t, raw[name]), name
            assert np.all(np.isfinite(t)), name
            if name.endswith(".adam_v"):
                assert np.all(t >= 0), name
            seen.add(name)
    assert seen == set(index["weight_map"]), sorted(set(index["weight_map"]) ^ seen)[:5]
    t = load_file(os.path.join(step_dir, "dense.safetensors"))
    assert t["embed"].shape == (V, H) and t["pos"].shape == (S, H) and t["final_norm"].shape == (H,)
    for e in range(E):
        assert f"blocks.1.moe.expert_w1.{e}" in seen, e
    print(f"ok: {len(seen)} tensors in {len(set(index['weight_map'].values()))} files at step {state['step']}")


if __name__ == "__main__":
    main()
