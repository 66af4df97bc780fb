"""Mooncake PG demo: N ranks on the `mooncake-cpu` backend.

Runs every collective and a P2P ring on CPU tensors, checks each result
against a value computed locally, then prints a short pgbench comparison
with gloo.

    PYTHONPATH=python python examples/pg_demo.py --nprocs 4
"""

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(name, got, want):
    if not torch.equal(got, want):
        raise AssertionError(f"{name}: got {got.tolist()}, expected {want.tolist()}")
    return name


def run_collectives(rank, world):
    done = []
    base = torch.arange(4, dtype=torch.int64)

    x = base + rank
    dist.all_reduce(x)
    done.append(check("all_reduce", x, base * world + sum(range(world))))

    x = base * (rank + 1) if rank == 0 else torch.zeros(4, dtype=torch.int64)
    dist.broadcast(x, src=0)
    done.append(check("broadcast", x, base))

    outs = [torch.empty(4, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(outs, base + rank)
    done.append(check("all_gather", torch.stack(outs), torch.stack([base + r for r in range(world)])))

    out = torch.empty(4 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(out, base + rank)
    done.append(check("all_gather_into_tensor", out, torch.cat([base + r for r in range(world)])))

    inp = torch.arange(2 * world, dtype=torch.int64) + rank
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, inp)
    full = torch.arange(2 * world, dtype=torch.int64) * world + sum(range(world))
    done.append(check("reduce_scatter_tensor", out, full[2 * rank:2 * rank + 2]))

    ins = [torch.full((2,), rank * 10 + r, dtype=torch.int64) for r in range(world)]
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter(out, ins)
    done.append(check("reduce_scatter", out, torch.full((2,), sum(p * 10 + rank for p in range(world)))))

    inp = torch.tensor([rank * 100 + r for r in range(world)], dtype=torch.int64)
    out = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(out, inp)
    done.append(check("all_to_all_single", out, torch.tensor([p * 100 + rank for p in range(world)])))

    ins = [torch.tensor([rank, r]) for r in range(world)]
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(outs, ins)
    done.append(check("all_to_all", torch.stack(outs), torch.stack([torch.tensor([p, rank]) for p in range(world)])))

    x = base + rank
    dist.reduce(x, dst=world - 1, op=dist.ReduceOp.MAX)
    if rank == world - 1:
        check("reduce", x, base + world - 1)
    done.append("reduce")

    gl = [torch.empty(4, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
    dist.gather(base + rank, gather_list=gl, dst=0)
    if rank == 0:
        check("gather", torch.stack(gl), torch.stack([base + r for r in range(world)]))
    done.append("gather")

    out = torch.empty(4, dtype=torch.int64)
    sl = [base * r for r in range(world)] if rank == 0 else None
    dist.scatter(out, scatter_list=sl, src=0)
    done.append(check("scatter", out, base * rank))

    dist.barrier()
    done.append("barrier")

    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)], objs
    done.append("all_gather_object")
    return done


def run_ring(rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    send = torch.full((1024,), float(rank))
    recv = torch.empty(1024)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right),
                                   dist.P2POp(dist.irecv, recv, left)])
    for r in reqs:
        r.wait()
    check("p2p ring", recv, torch.full((1024,), float(left)))


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from mooncake import pg  # noqa: F401  registers mooncake-cpu

    dist.init_process_group("mooncake-cpu", rank=rank, world_size=world)
    done = run_collectives(rank, world)
    run_ring(rank, world)
    dist.barrier()
    if rank == 0:
        print(f"[demo] {world} ranks on mooncake-cpu: {', '.join(done)}, p2p ring: all correct")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    mp.start_processes(worker, args=(args.nprocs, free_port()), nprocs=args.nprocs,
                       start_method="spawn")
    if args.no_bench:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    bench = os.path.join(here, "..", "benchmarks", "pgbench.py")
    print("[demo] pgbench: mooncake-cpu vs gloo, all_reduce, 4 ranks")
    subprocess.check_call([sys.executable, bench, "--collective", "all_reduce",
                           "--backend", "both", "--device", "cpu", "-g", str(args.nprocs),
                           "-b", "8", "-e", "4M", "-f", "16", "--iters", "20"])


if __name__ == "__main__":
    main()
