"""Fixtures for the EP suites: the fallback runs over mooncake-cpu and gloo groups.

Both backends run in every session (not only $MC_TEST_BACKEND): the fallback
must give the same answers on each. A mooncake backend that cannot be
imported fails the test (it is not skipped).
"""

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = os.path.dirname(_HERE)
_REPO = os.path.dirname(os.path.dirname(_TESTS))
for _p in (os.path.join(_REPO, "python"), _TESTS, _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

EP_BACKENDS = ("mooncake-cpu", "gloo")


@pytest.fixture(scope="session", params=EP_BACKENDS)
def backend(request):
    name = request.param
    err = harness.backend_import_error(name)
    if err is not None:
        pytest.fail(f"backend {name!r} is not available: {err}", pytrace=False)
    return name
