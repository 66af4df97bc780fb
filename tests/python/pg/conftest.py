"""Fixtures for the mooncake-cpu backend suites (see tests/python/harness.py).

`backend` is the backend under test: $MC_TEST_BACKEND (comma-separated) or
"mooncake-cpu". MC_TEST_BACKEND=gloo runs every suite against gloo to check the
tests themselves. A mooncake backend that cannot be imported fails the test
(it is not skipped).
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


@pytest.fixture(scope="session", params=harness.backends_under_test())
def backend(request):
    name = request.param
    err = harness.backend_import_error(name)
    if err is not None:
        pytest.fail(f"backend {name!r} is not available: {err}", pytrace=False)
    return name
