"""Fixtures for the mooncake-cpu backend suites (see tests/python/harness.py).

`backend` is the backend under test: $MC_TEST_BACKEND (comma-separated) or
"mooncake-cpu". MC_TEST_BACKEND=gloo runs every suite against gloo to check the
tests themselves. A mooncake backend that cannot be imported fails the test
(it is not skipped).

Modules marked `both_transports` (pytestmark) run every test twice, with
`transport` "shm" (shared memory between ranks of a host) and "tcp"
(MC_FORCE_TCP=1 in the workers: the TCP put path and bounce ring), through
harness.set_transport; run_ranks picks it up, and job caches key on
harness.current_transport(). Other modules run on the default path only.
"""

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = os.path.dirname(_HERE)
_REPO = os.path.dirname(os.path.dirname(_TESTS))
for _p in (os.path.join(_REPO, "python"), _TESTS):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "large: 1 GiB-scale test; runs by default (deselect with -m 'not large')")
    config.addinivalue_line(
        "markers", "elastic: elastic-membership scenarios in real processes (kills, joins); "
        "runs by default (deselect with -m 'not elastic')")
    config.addinivalue_line(
        "markers", "both_transports: run each test over shared memory and over TCP "
        "(select one with -k shm / -k tcp)")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_transports") is not None:
        metafunc.parametrize("transport", list(harness.TRANSPORTS))


@pytest.fixture(scope="session")
def transport():
    """The transport of tests in modules not marked both_transports: the default."""
    return "shm"


@pytest.fixture(autouse=True)
def _select_transport(request, transport):
    if transport != "shm" and "backend" in request.fixturenames:
        name = request.getfixturevalue("backend")
        if not harness.is_mooncake(name):
            pytest.skip(f"MC_FORCE_TCP changes only the mooncake backends; {name} runs once")
    harness.set_transport(transport)
    yield
    harness.set_transport("shm")


@pytest.fixture(scope="session", params=harness.backends_under_test())
def backend(request):
    name = request.param
    err = harness.backend_import_error(name)
    if err is not None:
        pytest.fail(f"backend {name!r} is not available: {err}", pytrace=False)
    return name
