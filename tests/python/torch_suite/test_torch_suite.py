"""torch's own distributed tests (curated in suite_cases.py) with gloo and mooncake-cpu.

Runs dist_suite.py once per backend (both at the same time, each in its own
pytest process, so a crash or hang of one cannot take this runner down), then
prints the per-test outcomes side by side with the counts and checks:

* neither run has an unexpected failure (mooncake-cpu's expected failures are
  strict: one that starts passing fails the run, so the lists stay current);
* every test that passes with gloo passes with mooncake-cpu, except those in
  suite_cases.expected_failures(), each listed there with its reason.

MC_TORCH_SUITE_INIT (tcp | file) picks the rendezvous; see dist_suite.py.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import suite_cases  # noqa: E402

BACKENDS = ("gloo", "mooncake-cpu")
RUN_TIMEOUT_S = 900


def _outcome(case: ET.Element) -> str:
    for child in case:
        if child.tag in ("failure", "error"):
            return "FAILED"
        if child.tag == "skipped":
            return "xfail" if child.get("type") == "pytest.xfail" else "skipped"
    return "passed"


# backend -> test name -> the failure's text from the report (the run's log
# is printed only in part), so that a CI failure says what went wrong.
FAILURE_TEXT: dict = {}


def _parse(path: str, backend: str) -> dict:
    """test name -> passed | skipped | xfail | FAILED, from a junit XML report."""
    out = {}
    texts = FAILURE_TEXT.setdefault(backend, {})
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        outcome = _outcome(case)
        if outcome == "FAILED":
            for child in case:
                if child.tag in ("failure", "error"):
                    texts[name] = texts.get(name, "") + (child.get("message") or "") + "\n" + \
                        (child.text or "")
        # A test may report twice (a failing teardown): the worse outcome wins.
        if out.get(name) != "FAILED":
            out[name] = outcome
    return out


def _failure_texts(backend: str, names) -> str:
    texts = FAILURE_TEXT.get(backend, {})
    return "".join(f"\n--- {n} ---\n{texts.get(n, '(no text in the report)')[-3000:]}"
                   for n in names)


def _start(backend: str, tmpdir: str):
    report = os.path.join(tmpdir, f"{backend}.xml")
    log = open(os.path.join(tmpdir, f"{backend}.log"), "w")
    env = dict(os.environ, BACKEND=backend, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(_REPO, "python"), _HERE,
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rsxX", "-p", "no:cacheprovider",
           "-W", "ignore::DeprecationWarning", os.path.join(_HERE, "dist_suite.py"),
           f"--junitxml={report}"]
    return subprocess.Popen(cmd, cwd=_REPO, env=env, stdout=log, stderr=subprocess.STDOUT), \
        report, log


def _tail(path: str, n: int = 60) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


@pytest.fixture(scope="module")
def results(request):
    tmpdir = tempfile.mkdtemp(prefix="mc_torch_suite_")
    t0 = time.monotonic()
    runs = {b: _start(b, tmpdir) for b in BACKENDS}
    out, problems, summaries = {}, [], {}
    for backend, (proc, report, log) in runs.items():
        try:
            rc = proc.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            problems.append(f"{backend}: the suite did not finish within {RUN_TIMEOUT_S} s")
        log.close()
        print(f"\n===== {backend}: exit {rc}; last lines of its pytest run =====")
        print(_tail(log.name, 25))
        summaries[backend] = f"{backend} pytest: " + (_tail(log.name, 1).strip() or f"exit {rc}")
        if not os.path.exists(report):
            problems.append(f"{backend}: no report (exit {rc}); log tail:\n{_tail(log.name)}")
            continue
        out[backend] = _parse(report, backend)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    # The comparison is the point of this run: show it in CI logs even when
    # pytest captures output (a passing test's prints are otherwise dropped).
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        lines = _table(out, time.monotonic() - t0) + list(summaries.values())
        print("\n" + "\n".join(lines), flush=True)
    yield out
    shutil.rmtree(tmpdir, ignore_errors=True)  # on failure the log tails are printed above


def _table(out: dict, wall_s: float) -> list:
    names = sorted(set().union(*[set(r) for r in out.values()]))
    width = max(len(n) for n in names)
    head = "torch distributed suite"
    width = max(width, len(head))
    lines = [f"{head:<{width}}  " + "  ".join(f"{b:<12}" for b in BACKENDS)]
    for n in names:
        lines.append(f"{n:<{width}}  " + "  ".join(f"{out[b].get(n, '-'):<12}" for b in BACKENDS))
    for b in BACKENDS:
        counts = {k: sum(1 for v in out[b].values() if v == k)
                  for k in ("passed", "skipped", "xfail", "FAILED")}
        lines.append(f"{b}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
                     + f" of {len(out[b])} (both runs together: {wall_s:.0f} s)")
    for n, why in sorted(suite_cases.expected_failures().items()):
        lines.append(f"mooncake-cpu expected failure {n}: {why}")
    return lines


def test_curated_list_is_large_enough():
    assert len(set(suite_cases.CASES)) == len(suite_cases.CASES), "duplicate names in CASES"
    assert len(suite_cases.CASES) >= 60, f"only {len(suite_cases.CASES)} curated tests"
    unknown = set(suite_cases.expected_failures()) - set(suite_cases.CASES)
    assert not unknown, f"expected failures not in CASES: {sorted(unknown)}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_curated_test_ran_without_unexpected_failure(results, backend):
    got = results[backend]
    missing = sorted(set(suite_cases.CASES) - set(got))
    assert not missing, f"{backend}: curated tests missing from the report: {missing}"
    failed = sorted(n for n, o in got.items() if o == "FAILED")
    assert not failed, (f"{backend}: {len(failed)} tests failed (an expected failure that "
                        f"passed counts as failed: shrink suite_cases): {failed}"
                        + _failure_texts(backend, failed))
    if backend != "gloo":
        xfailed = {n for n, o in got.items() if o == "xfail"}
        assert xfailed == set(suite_cases.expected_failures()), \
            f"expected failures differ: {sorted(xfailed ^ set(suite_cases.expected_failures()))}"


def test_mooncake_passes_what_gloo_passes(results):
    allowed = suite_cases.expected_failures()
    gloo, mc = results["gloo"], results["mooncake-cpu"]
    lacking = sorted(n for n, o in gloo.items()
                     if o == "passed" and mc.get(n) != "passed" and n not in allowed)
    assert not lacking, ("passed with gloo but not with mooncake-cpu (and not listed in "
                         "suite_cases with a reason): "
                         + ", ".join(f"{n} ({mc.get(n)})" for n in lacking)
                         + _failure_texts("mooncake-cpu", lacking))
    for n, why in sorted(allowed.items()):
        print(f"exception: {n}: gloo {gloo.get(n)}, mooncake-cpu {mc.get(n)}: {why}")
