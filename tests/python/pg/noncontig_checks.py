"""Every collective with non-contiguous inputs and outputs (test_collectives.py,
category "views_and_noncontiguous").

The user guide promises that non-contiguous tensors are copied to contiguous
buffers and the results copied back, so each check demands the exact values
(a rejection is a failure). Outputs are strided slices of a larger buffer
whose gaps hold a sentinel that must survive, or transposed views. Expected
values are computed here in torch from every rank's input (pg_checks.make);
gloo runs the same call as a second reference where it accepts it.
"""

import torch
import torch.distributed as dist

from pg_checks import local_reduce, make

SENTINEL = -7.0


def nc(x):
    """A non-contiguous tensor equal to `x`: transposed storage for 2-D, every
    second element of a buffer for 1-D (the gaps hold SENTINEL)."""
    if x.dim() >= 2:
        v = x.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        base = torch.full((2 * x.numel(),), SENTINEL, dtype=x.dtype)
        v = base[::2]
        v.copy_(x)
    assert not v.is_contiguous() and torch.equal(v, x)
    return v


class Out:
    """A non-contiguous output of `shape`: a strided slice of a sentinel-filled
    buffer (1-D) or a transposed view (2-D), zeroed. values() returns what the
    call wrote plus the gaps, so a write past the view shows up as a difference."""

    def __init__(self, shape, dtype=torch.float32):
        if len(shape) >= 2:
            self.base = torch.zeros(shape[1], shape[0], *shape[2:], dtype=dtype)
            self.view = self.base.transpose(0, 1)
            self.gaps = None
        else:
            self.base = torch.full((2 * shape[0],), SENTINEL, dtype=dtype)
            self.view = self.base[::2]
            self.view.zero_()
            self.gaps = self.base[1::2]
        assert not self.view.is_contiguous()

    def values(self):
        out = [self.view.contiguous()]
        if self.gaps is not None:
            out.append(self.gaps.clone())
        return out

    @staticmethod
    def expect(value):
        """What values() must return when the call wrote `value`."""
        out = [value.contiguous()]
        if value.dim() < 2:
            out.append(torch.full((value.numel(),), SENTINEL, dtype=value.dtype))
        return out


def noncontiguous_checks(ctx, ck, cat):
    r, ws = ctx.rank, ctx.world_size
    f32 = torch.float32
    mats = [make("nc|m", q, (3, 33), f32) for q in range(ws)]
    vecs = [make("nc|v", q, (12,), f32) for q in range(ws)]
    root = ws - 1

    def ar_transposed(g):
        t = nc(mats[r])
        dist.all_reduce(t, group=g)
        return [t.contiguous()]
    ck.check(cat, "all_reduce in place on a transposed tensor", ar_transposed,
             [local_reduce(mats, "SUM", f32)])

    ints = [make("nc|i", q, (4, 6), torch.int32) for q in range(ws)]

    def ar_int(g):
        t = nc(ints[r])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        return [t.contiguous()]
    ck.check(cat, "all_reduce MAX in place on a transposed int32 tensor", ar_int,
             [local_reduce(ints, "MAX", torch.int32)])

    def ar_strided(g):
        t = nc(vecs[r])
        dist.all_reduce(t, group=g)
        return [t.contiguous(), t._base[1::2].clone()]
    ck.check(cat, "all_reduce in place on a strided slice (gaps untouched)", ar_strided,
             Out.expect(local_reduce(vecs, "SUM", f32)),
             gloo_bug="reduces a strided slice as if contiguous (it overwrites the gaps)")

    def reduce_t(g):
        t = nc(mats[r])
        dist.reduce(t, dst=root, group=g)
        return [t.contiguous()] if r == root else None
    ck.check(cat, "reduce in place on a transposed tensor", reduce_t,
             [local_reduce(mats, "SUM", f32)] if r == root else None)

    def bc_transposed(g):
        t = nc(mats[r])
        dist.broadcast(t, src=root, group=g)
        return [t.contiguous()]
    ck.check(cat, "broadcast on a transposed tensor", bc_transposed, [mats[root]])

    def bc_strided(g):
        base = mats[r].clone()
        dist.broadcast(base[:, ::2], src=0, group=g)
        return [base]
    want = mats[r].clone()
    want[:, ::2] = mats[0][:, ::2]
    # gloo broadcasts into a strided slice as if it were contiguous (it overwrites
    # the columns in between), so only the local reference is used here.
    ck.check(cat, "broadcast into a strided slice (columns in between untouched)", bc_strided, [want],
             gloo_bug="writes a strided broadcast destination as if contiguous")

    def ag(g):
        outs = [Out((12,)) for _ in range(ws)]
        dist.all_gather([o.view for o in outs], nc(vecs[r]), group=g)
        return [v for o in outs for v in o.values()]
    ck.check(cat, "all_gather from and into strided slices", ag,
             [v for q in range(ws) for v in Out.expect(vecs[q])])

    def ag_into(g):
        out = Out((ws * 12,))
        dist.all_gather_into_tensor(out.view, nc(vecs[r]), group=g)
        return out.values()
    ck.check(cat, "all_gather_into_tensor from and into strided slices", ag_into,
             Out.expect(torch.cat(vecs)))

    def ag_into_t(g):
        out = Out((ws * 3, 33))
        dist.all_gather_into_tensor(out.view, nc(mats[r]), group=g)
        return out.values()
    ck.check(cat, "all_gather_into_tensor from and into transposed tensors", ag_into_t,
             Out.expect(torch.cat(mats)))

    # reduce_scatter: rank q's block b is rows (3b..3b+2) of a (3 ws, 33) matrix.
    tall = [make("nc|rs", q, (3 * ws, 33), f32) for q in range(ws)]

    def rs(g):
        out = Out((3, 33))
        dist.reduce_scatter(out.view, [nc(b) for b in tall[r].split(3)], group=g)
        return out.values()
    ck.check(cat, "reduce_scatter from and into transposed tensors", rs,
             Out.expect(local_reduce([t[3 * r:3 * r + 3] for t in tall], "SUM", f32)))

    longs = [make("nc|rst", q, (4 * ws,), f32) for q in range(ws)]

    def rs_tensor(g):
        out = Out((4,))
        dist.reduce_scatter_tensor(out.view, nc(longs[r]), group=g)
        return out.values()
    ck.check(cat, "reduce_scatter_tensor from and into strided slices", rs_tensor,
             Out.expect(local_reduce([x[4 * r:4 * r + 4] for x in longs], "SUM", f32)),
             gloo_bug="aborts the process on a strided reduce_scatter_tensor (3+ ranks)")

    # all_to_all: rank q sends block p of its input (p + 2 rows) to rank p.
    blocks = [[make(f"nc|a2a|{p}", q, (p + 2, 5), f32) for p in range(ws)] for q in range(ws)]

    def a2a(g):
        outs = [Out((r + 2, 5)) for _ in range(ws)]
        dist.all_to_all([o.view for o in outs], [nc(b) for b in blocks[r]], group=g)
        return [v for o in outs for v in o.values()]
    ck.check(cat, "all_to_all from and into transposed tensors", a2a,
             [v for q in range(ws) for v in Out.expect(blocks[q][r])])

    # all_to_all_single with uneven splits: rank q sends q + p + 1 elements to p.
    def sizes(q):
        return [q + p + 1 for p in range(ws)]
    flat = [make("nc|a2as", q, (sum(sizes(q)),), f32) for q in range(ws)]

    def a2a_single(g):
        in_splits = sizes(r)
        out_splits = [q + r + 1 for q in range(ws)]
        out = Out((sum(out_splits),))
        dist.all_to_all_single(out.view, nc(flat[r]), output_split_sizes=out_splits,
                               input_split_sizes=in_splits, group=g)
        return out.values()
    want = torch.cat([flat[q].split(sizes(q))[r] for q in range(ws)])
    ck.check(cat, "all_to_all_single (uneven splits) from and into strided slices", a2a_single,
             Out.expect(want))

    def gather(g):
        outs = [Out((3, 33)) for _ in range(ws)] if r == root else None
        dist.gather(nc(mats[r]), gather_list=[o.view for o in outs] if outs else None, dst=root, group=g)
        return [v for o in outs for v in o.values()] if outs else None
    ck.check(cat, "gather from and into transposed tensors", gather,
             [v for q in range(ws) for v in Out.expect(mats[q])] if r == root else None)

    parts = [make("nc|sc", p, (12,), f32) for p in range(ws)]

    def scatter(g):
        out = Out((12,))
        dist.scatter(out.view, scatter_list=[nc(p) for p in parts] if r == root else None,
                     src=root, group=g)
        return out.values()
    ck.check(cat, "scatter from and into strided slices", scatter, Out.expect(parts[r]),
             gloo_bug="scatters into a strided slice as if contiguous")

    def coalesced(g):
        ts = [nc(mats[r]), nc(vecs[r])]
        dist.all_reduce_coalesced(ts, group=g)
        return [t.contiguous() for t in ts]
    ck.check(cat, "all_reduce_coalesced on a transposed tensor and a strided slice", coalesced,
             [local_reduce(mats, "SUM", f32), local_reduce(vecs, "SUM", f32)])
