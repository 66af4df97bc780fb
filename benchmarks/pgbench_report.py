"""pgbench's tables from the rows of a run, imported by pgbench.py: the ratio against the
peer backend, busbw over the memcpy and link copies, the fraction of the HBM traffic
limit, and the printed tables."""

from pgbench_bench import LAUNCH_FLOOR, MOONCAKE, MOONCAKE_CUDA, PEERS, bus_factor, mooncake_name


def _fmt_opt(v):
    return "-" if v is None else f"{v:.2f}"


def link_fractions(rows):
    """busbw over the GPU 0 -> GPU 1 copy bandwidth of the same run, for every row."""
    copy = [r for r in rows if r["collective"] == "link_copy"]
    if not copy:
        return []
    gbps = copy[0]["busbw_GBps"]
    return [{"collective": r["collective"], "backend": r["backend"], "size": r["size"],
             "busbw_GBps": r["busbw_GBps"], "link_GBps": gbps, "busbw_over_link": r["busbw_GBps"] / gbps}
            for r in rows if r["collective"] != "link_copy"]


def traffic_bytes(coll, size, n):
    """HBM bytes an op must move at least (read every input, write every output);
    `size` is the benchmark's size (the larger side). None: no limit defined."""
    if coll == "all_reduce":
        return 2 * n * size
    if coll in ("all_gather", "reduce_scatter"):
        return (n + 1) * size
    if coll in ("all_to_all", "all_to_all_v", "sendrecv"):
        return 2 * n * size
    return None


def limit_fractions(rows):
    """Each row's limit time (traffic / device copy GB/s) over its measured time."""
    copy = [r for r in rows if r["collective"] == "device_copy"]
    if not copy:
        return []
    gbps = copy[0]["busbw_GBps"]
    out = []
    for r in rows:
        t = traffic_bytes(r["collective"], r["size"], r["nranks"])
        if t is None or r["collective"] == "device_copy" or r["backend"] == LAUNCH_FLOOR:
            continue
        limit_us = t / (gbps * 1e9) * 1e6
        out.append({"collective": r["collective"], "backend": r["backend"], "size": r["size"],
                    "time_us": r["time_us_median"], "limit_us": limit_us, "copy_GBps": gbps,
                    "fraction_of_limit": limit_us / r["time_us_median"]})
    return out


def memcpy_ratios(rows):
    """busbw / single-thread memcpy GB/s for every measured row."""
    copy = {r["size"]: r["busbw_GBps"] for r in rows if r["collective"] == "memcpy"}
    out = []
    for r in rows:
        if r["collective"] == "memcpy" or r["size"] not in copy or not copy[r["size"]]:
            continue
        out.append({"collective": r["collective"], "backend": r["backend"], "size": r["size"],
                    "busbw_GBps": r["busbw_GBps"], "memcpy_GBps": copy[r["size"]],
                    "busbw_over_memcpy": r["busbw_GBps"] / copy[r["size"]]})
    return out


def launch_floors(rows):
    """Each timed row of the size where the bare CUDA op ran, against that op's time: what the
    collective costs over the host's floor per op."""
    out = []
    for f in (r for r in rows if r["backend"] == LAUNCH_FLOOR):
        for r in rows:
            if r["size"] != f["size"] or r["collective"] != f["collective"] or r["backend"] == LAUNCH_FLOOR:
                continue
            out.append({"collective": r["collective"], "backend": r["backend"], "size": r["size"],
                        "time_us": r["time_us_median"], "floor_us": f["time_us_median"],
                        "floor_issue_us": f.get("issue_us_median"),
                        "over_floor_us": r["time_us_median"] - f["time_us_median"]})
    return out


# --------------------------------------------------------------------------- output

def peer_of(rows):
    """The reference backend measured in `rows` (gloo or nccl), or None."""
    return next((b for b in PEERS if any(r["backend"] == b for r in rows)), None)


def ratios(rows):
    """mooncake over the peer backend of the same run, per collective and size."""
    peer = peer_of(rows)
    by = {}
    for row in rows:
        by[(row["collective"], row["size"], row["backend"])] = row
    out = []
    for (coll, size, b), row in by.items():
        if b not in (MOONCAKE, MOONCAKE_CUDA) or (coll, size, peer) not in by:
            continue
        g = by[(coll, size, peer)]
        out.append({"collective": coll, "size": size, "peer": peer,
                    "busbw_ratio": row["busbw_GBps"] / g["busbw_GBps"] if g["busbw_GBps"] else None,
                    "latency_ratio": row["time_us_median"] / g["time_us_median"] if g["time_us_median"] else None,
                    "latency_ratio_p99": row["time_us_p99"] / g["time_us_p99"] if g["time_us_p99"] else None})
    return out


def print_tables(rows, rats, args, n):
    print(f"# pgbench  nranks={n} device={args.device} dtype={args.dtype} op={args.op} "
          f"iters<={args.iters} warmup={args.warmup} sizes={args.minbytes}..{args.maxbytes} x{args.stepfactor}")
    for coll in dict.fromkeys(r["collective"] for r in rows
                              if r["collective"] not in ("memcpy", "device_copy", "link_copy")):
        for b in dict.fromkeys(r["backend"] for r in rows):
            sel = [r for r in rows if r["collective"] == coll and r["backend"] == b]
            if not sel:
                continue
            print(f"#\n# collective={coll} backend={b}  (busbw factor {bus_factor(coll, n):.3f})")
            cuda = args.device == "cuda"
            print(f"# {'size':>12} {'count':>12} {'type':>8} {'time_us':>11} {'p99_us':>11} "
                  f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'iters':>6} {'check':>7}"
                  + (f" {'issue_us':>9} {'worker_us':>9}" if cuda else ""))
            for r in sel:
                print(f"  {r['size']:>12} {r['count']:>12} {r['type']:>8} {r['time_us_median']:>11.2f} "
                      f"{r['time_us_p99']:>11.2f} {r['algbw_GBps']:>12.3f} {r['busbw_GBps']:>12.3f} "
                      f"{r['iters']:>6} {r['check']:>7}"
                      + (f" {r['issue_us_median']:>9.2f} {_fmt_opt(r['worker_run_us_mean']):>9}"
                         if cuda else ""))
        sel = [x for x in rats if x["collective"] == coll]
        if sel:
            print(f"#\n# collective={coll} ratio {mooncake_name(args.device)} / {sel[0]['peer']}  "
                  "(busbw: higher is better; latency: lower is better)")
            print(f"# {'size':>12} {'busbw_ratio':>12} {'lat_ratio':>10} {'p99_ratio':>10}")
            for x in sel:
                f = lambda v: f"{v:.2f}" if v is not None else "n/a"  # noqa: E731
                print(f"  {x['size']:>12} {f(x['busbw_ratio']):>12} {f(x['latency_ratio']):>10} "
                      f"{f(x['latency_ratio_p99']):>10}")
    mrat = memcpy_ratios(rows)
    if mrat:
        backends = list(dict.fromkeys(x["backend"] for x in mrat))
        copy = {r["size"]: r for r in rows if r["collective"] == "memcpy"}
        for coll in dict.fromkeys(x["collective"] for x in mrat):
            print(f"#\n# collective={coll} busbw / single-thread memcpy (rank 0, same run)")
            head = "".join(f" {b + ' busbw':>18} {'ratio':>6}" for b in backends)
            print(f"# {'size':>12} {'memcpy(GB/s)':>13}{head}")
            for size in sorted({x["size"] for x in mrat if x["collective"] == coll}):
                cells = ""
                for b in backends:
                    m = [x for x in mrat if x["collective"] == coll and x["backend"] == b and x["size"] == size]
                    cells += (f" {m[0]['busbw_GBps']:>18.3f} {m[0]['busbw_over_memcpy']:>6.2f}" if m
                              else f" {'n/a':>18} {'n/a':>6}")
                print(f"  {size:>12} {copy[size]['busbw_GBps']:>13.3f}{cells}")
    fracs = limit_fractions(rows)
    if fracs:
        print(f"#\n# fraction of the HBM traffic limit (device copy {fracs[0]['copy_GBps']:.0f} GB/s "
              "read+write, same run; 1.0 = the limit)")
        print(f"# {'collective':>14} {'backend':>14} {'size':>12} {'time_us':>11} {'limit_us':>10} {'fraction':>9}")
        for x in fracs:
            print(f"  {x['collective']:>14} {x['backend']:>14} {x['size']:>12} {x['time_us']:>11.2f} "
                  f"{x['limit_us']:>10.2f} {x['fraction_of_limit']:>9.4f}")
    floors = launch_floors(rows)
    if floors:
        issue = floors[0]["floor_issue_us"]
        print(f"#\n# against a bare CUDA op (x.add_(1)) issued back to back in every rank, same run: "
              f"{floors[0]['floor_us']:.2f} us per op" + (f" (host issue {issue:.2f} us)" if issue else ""))
        print(f"# {'collective':>14} {'backend':>14} {'size':>12} {'time_us':>11} {'over_floor_us':>14}")
        for x in floors:
            print(f"  {x['collective']:>14} {x['backend']:>14} {x['size']:>12} {x['time_us']:>11.2f} "
                  f"{x['over_floor_us']:>14.2f}")
    links = link_fractions(rows)
    if links:
        print(f"#\n# busbw over the GPU 0 -> GPU 1 copy ({links[0]['link_GBps']:.0f} GB/s one way, same run)")
        print(f"# {'collective':>14} {'backend':>14} {'size':>12} {'busbw(GB/s)':>12} {'fraction':>9}")
        for x in links:
            print(f"  {x['collective']:>14} {x['backend']:>14} {x['size']:>12} {x['busbw_GBps']:>12.3f} "
                  f"{x['busbw_over_link']:>9.4f}")
    bad = [r for r in rows if r["check"] == "FAILED"]
    if bad:
        print(f"# WARNING: {len(bad)} row(s) failed the correctness check: "
              + ", ".join(f"{r['backend']} {r['collective']} {r['size']} B" for r in bad))
