"""A small distributed program for the launcher tests in test_init.py.

    python -m torch.distributed.run --nproc-per-node 2 dist_script.py --backend B --out DIR
    python dist_script.py --mode mpspawn --nprocs 2 --backend B --out DIR [--pg-options]

Each rank initialises the backend, runs a few collectives, writes
DIR/rank<r>.json with what it saw, destroys the group and exits normally (so a
backend that breaks interpreter shutdown shows up as a non-zero exit code).
"""

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def body(backend, rank, world_size, out_dir, pg_options):
    if backend != "gloo":
        from mooncake import pg
        kwargs = {"pg_options": pg.MooncakeBackendOptions(world_size)} if pg_options else {}
    else:
        kwargs = {}
    if rank is None:  # torchrun: everything from the environment
        dist.init_process_group(backend=backend, **kwargs)
    else:
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    rank, ws = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "pid": os.getpid()})
    b = torch.arange(3, dtype=torch.int64) * (rank + 1)
    dist.broadcast(b, src=ws - 1)
    dist.barrier()
    result = {"rank": rank, "world_size": ws, "backend": dist.get_backend(),
              "all_reduce": t.tolist(), "objects": objs, "broadcast": b.tolist(),
              "env_rank": os.environ.get("RANK"), "local_rank": os.environ.get("LOCAL_RANK")}
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _spawn_entry(rank, backend, world_size, out_dir, port, pg_options):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    body(backend, rank, world_size, out_dir, pg_options)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["torchrun", "mpspawn"], default="torchrun")
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--pg-options", action="store_true")
    a = ap.parse_args()
    if a.mode == "torchrun":
        body(a.backend, None, None, a.out, a.pg_options)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    import torch.multiprocessing as mp
    mp.spawn(_spawn_entry, args=(a.backend, a.nprocs, a.out, port, a.pg_options), nprocs=a.nprocs, join=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
