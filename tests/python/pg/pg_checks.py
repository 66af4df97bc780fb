"""Shared helpers for the PG suites: deterministic inputs, local references, a checker.

Inputs are generated from a string key and the rank with a seeded generator, so
every rank can rebuild any other rank's input and compute the expected result of
a collective locally. Values are chosen so that results are exact in every
dtype whatever the summation order (small half-integers for SUM/AVG, powers of
two for PRODUCT), which lets the suites compare bit-for-bit.
"""

import functools
import re
import zlib

import torch
import torch.distributed as dist

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
DTYPES = FLOATS + INTS + (torch.bool,)
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
BITWISE = ("BAND", "BOR", "BXOR")

# AVG on integer tensors: gloo and NCCL disagree on whether it exists, so either
# the exact floor quotient (inputs are non-negative, so floor == trunc) or an
# error that names AVG is accepted.
AVG_INT_REJECTION = r"(?i)\bavg\b|average"

# Errors that only mean "gloo does not implement this"; when gloo itself is the
# backend under test, such a combination is reported as n/a, not as a failure.
GLOO_LIMITATION = (r"does not support|Invalid scalar type|can't be cast to the desired output type"
                   r"|Cannot use ReduceOp")


def short(dtype):
    return str(dtype).replace("torch.", "")


def reduce_cases():
    """(op, dtype) pairs every backend must support (the unsupported ones live in test_bad_input)."""
    for dtype in DTYPES:
        for op in OPS:
            if op in BITWISE and dtype.is_floating_point:
                continue
            if op == "AVG" and dtype == torch.bool:
                continue
            yield op, dtype


def make(key, rank, shape, dtype, kind="sum"):
    """Deterministic input for (key, rank). kind: sum | avg | prod | full."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if kind == "avg" and not dtype.is_floating_point:
        return torch.randint(0, 10, shape, generator=g).to(dtype)
    if kind in ("sum", "avg"):
        if dtype.is_floating_point:
            return (torch.randint(-16, 17, shape, generator=g).double() / 2).to(dtype)
        lo, hi = (0, 16) if dtype == torch.uint8 else (-8, 9)
        return torch.randint(lo, hi, shape, generator=g).to(dtype)
    if kind == "prod":
        if dtype.is_floating_point:
            values = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=torch.float64)
        elif dtype == torch.uint8:
            values = torch.tensor([1, 2, 3], dtype=torch.int64)
        else:
            values = torch.tensor([-2, -1, 1, 2], dtype=torch.int64)
        return values[torch.randint(0, len(values), shape, generator=g)].to(dtype)
    if kind == "full":
        if dtype.is_floating_point:
            return (torch.randn(shape, generator=g, dtype=torch.float64) * 1000).to(dtype)
        if dtype == torch.int64:
            return torch.randint(-2 ** 62, 2 ** 62, shape, generator=g, dtype=torch.int64) * 2 + \
                torch.randint(0, 2, shape, generator=g, dtype=torch.int64)
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max + 1, shape, generator=g, dtype=torch.int64).to(dtype)
    raise ValueError(kind)


def kind_for(op):
    return {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod"}.get(op, "full")


def rop(op):
    return getattr(dist.ReduceOp, op)


def local_reduce(xs, op, dtype):
    """Element-wise reduction of the per-rank inputs `xs` with gloo/NCCL semantics."""
    stacked = torch.stack(list(xs))
    if dtype == torch.bool:  # bool: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = parity
        if op in ("SUM", "MAX", "BOR"):
            return stacked.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stacked.all(0)
        if op == "BXOR":
            return (stacked.to(torch.int64).sum(0) % 2).bool()
        raise ValueError(op)
    if op in BITWISE:
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        return functools.reduce(fn, xs)
    if op == "MIN":
        return stacked.amin(0)
    if op == "MAX":
        return stacked.amax(0)
    wide = stacked.double() if dtype.is_floating_point else stacked.long()
    if op == "SUM":
        return wide.sum(0).to(dtype)
    if op == "PRODUCT":
        return wide.prod(0).to(dtype)
    if op == "AVG":
        if dtype.is_floating_point:
            return (wide.sum(0) / len(xs)).to(dtype)
        return torch.div(wide.sum(0), len(xs), rounding_mode="floor").to(dtype)
    raise ValueError(op)


TOLERANCE = {  # for AVG only: the division may round differently from the reference
    torch.float32: dict(rtol=1e-6, atol=1e-6),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}


def diff(got, want, approx=False):
    """None when equal (exactly, or within TOLERANCE with approx), else a description."""
    if not isinstance(got, torch.Tensor):
        return None if got == want else f"got {got!r:.200}, expected {want!r:.200}"
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        return f"got {short(got.dtype)}{tuple(got.shape)}, expected {short(want.dtype)}{tuple(want.shape)}"
    if approx and got.is_floating_point():
        try:
            torch.testing.assert_close(got, want, **TOLERANCE[got.dtype])
            return None
        except AssertionError as e:
            return str(e).strip().replace("\n", " ")[:400]
    if torch.equal(got, want):
        return None
    bad = (got != want).reshape(-1).nonzero().reshape(-1)
    i = int(bad[0])
    g, w = got.reshape(-1), want.reshape(-1)
    return (f"{len(bad)} of {got.numel()} elements differ; first at flat index {i}: "
            f"got {g[i].item()!r}, expected {w[i].item()!r}")


def diff_lists(got, want, approx=False):
    if want is None:
        return None
    if got is None or len(got) != len(want):
        return f"got {0 if got is None else len(got)} outputs, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        d = diff(a, b, approx)
        if d:
            return f"output[{i}]: {d}" if len(want) > 1 else d
    return None


class Checker:
    """Runs one operation through the backend under test and through gloo, compares both.

    `run(group)` performs the operation on `group` (None = the default group, the
    backend under test; ctx.ref = gloo) with fresh copies of this rank's inputs and
    returns a list of output tensors, or None on ranks with no defined output.
    `expected` is the locally computed result (None where undefined).

    * gloo succeeded: gloo's result must equal `expected` (else the test itself
      is wrong: reported as REFERENCE), and the backend's result must equal gloo's.
    * gloo raised (it lacks the dtype or op): the backend is checked against
      `expected`, the reference computed here in torch.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.failures = []      # (category, label, detail)
        self.counts = {}        # category -> {status: n}

    def _count(self, cat, status):
        self.counts.setdefault(cat, {}).setdefault(status, 0)
        self.counts[cat][status] += 1

    def fail(self, cat, label, detail):
        self.failures.append((cat, label, detail))
        self._count(cat, "failed")
        self.ctx.note(f"FAIL {cat} {label}: {detail[:300]}")

    def check(self, cat, label, run, expected, approx=False, allow_error=None, use_ref=True,
              gloo_bug=None):
        """gloo_bug: a known gloo defect for this check; gloo is then not used as the
        reference, and when gloo is the backend under test a mismatch is counted as
        'known gloo bug' instead of a failure."""
        ctx = self.ctx
        if gloo_bug:
            use_ref = False
        ctx.note(f"{cat} {label}")
        ref, ref_err = None, None
        if use_ref and ctx.ref is not None:
            try:
                ref = run(ctx.ref)
            except Exception as e:  # noqa: BLE001
                ref_err = e
        try:
            got = run(None)
        except Exception as e:  # noqa: BLE001
            text = f"{type(e).__name__}: {e}".strip()
            if ctx.backend == "gloo" and (ref_err is not None or re.search(GLOO_LIMITATION, text)):
                self._count(cat, "n/a (gloo lacks it)")
            elif allow_error and re.search(allow_error, text):
                self._count(cat, "rejected as allowed")
            else:
                self.fail(cat, label, f"raised {text[:600]}")
            return
        if ref_err is None and use_ref and ctx.ref is not None:
            d = diff_lists(ref, expected, approx)
            if d:
                self.fail(cat, label, f"REFERENCE: gloo disagrees with the local reference: {d}")
                return
            d = diff_lists(got, ref, approx)
            if d:
                self.fail(cat, label, f"differs from gloo: {d}")
                return
            self._count(cat, "passed (vs gloo)")
        else:
            d = diff_lists(got, expected, approx)
            if d and gloo_bug and ctx.backend == "gloo":
                self._count(cat, "known gloo bug")
                return
            if d:
                self.fail(cat, label, f"differs from the local reference: {d}")
                return
            self._count(cat, "passed (vs local reference)")

    def result(self):
        return {"failures": self.failures, "counts": self.counts}


def summarize(results, category=None):
    """Merges per-rank Checker.result() dicts: (failure lines, merged counts)."""
    lines, counts = [], {}
    for rank, res in enumerate(results):
        for cat, label, detail in res["failures"]:
            if category is None or cat == category:
                lines.append(f"[rank {rank}] {cat} {label}: {detail}")
        for cat, c in res["counts"].items():
            if category is None or cat == category:
                for status, n in c.items():
                    counts[status] = counts.get(status, 0) + n
    return lines, counts
