"""Oracle smoke test: a 2-rank gloo DCP save then load in PyTorch 2.6.

    scripts/oracle-python tests/oracle/dcp_smoke.py OUT_DIR

Saves a row-sharded DTensor (Shard(0) over a 2-rank CPU mesh), a replicated tensor and a
non-tensor value to OUT_DIR with dcp.save, loads them into fresh zeroed objects with dcp.load,
checks every value, and prints "dcp smoke ok: torch <version>" from rank 0.
"""

import os
import sys

import dcp_oracle

ROWS, COLS = 8, 3


def job(rank, world_size, out_dir):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    full = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
    bias = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    state = {
        "w": distribute_tensor(full, mesh, [Shard(0)]),
        "b": bias.clone(),
        "step": 7,
    }
    local = state["w"].to_local()
    assert local.shape == (ROWS // world_size, COLS), local.shape
    dcp.save(state, checkpoint_id=out_dir)

    target = {
        "w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]),
        "b": torch.zeros(3, dtype=torch.bfloat16),
        "step": 0,
    }
    dcp.load(target, checkpoint_id=out_dir)
    got = target["w"].full_tensor()
    assert torch.equal(got, full), f"rank {rank}: w loaded {got} expected {full}"
    assert torch.equal(target["w"].to_local(), local), f"rank {rank}: local shard differs"
    assert torch.equal(target["b"], bias), f"rank {rank}: b loaded {target['b']}"
    assert target["step"] == 7, f"rank {rank}: step loaded {target['step']}"

    if rank == 0:
        files = sorted(os.listdir(out_dir))
        for name in [".metadata"] + [f"__{r}_0.distcp" for r in range(world_size)]:
            assert name in files, f"{name} missing from {files}"
        dcp_oracle.rank_print(rank, "files", " ".join(files))
        print(f"dcp smoke ok: torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: dcp_smoke.py OUT_DIR")
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    dcp_oracle.run_ranks(job, world_size=2, args=(out,), timeout_s=240)
