"""The version-suffixed module loader reports mismatches clearly."""

import importlib
import sys

import pytest
import torch

from mooncake import _loader


def test_suffix_strips_local_version():
    assert _loader.torch_version_suffix("2.11.0+cu130") == "2_11_0"
    assert _loader.torch_version_suffix("2.5.1") == "2_5_1"


@pytest.mark.parametrize("module,component", [("pg", "Mooncake PG")])
def test_import_under_other_torch_version_names_it(monkeypatch, module, component):
    monkeypatch.setattr(torch, "__version__", "9.9.9+fake")
    sys.modules.pop(f"mooncake.{module}", None)
    with pytest.raises(ImportError) as info:
        importlib.import_module(f"mooncake.{module}")
    text = str(info.value)
    assert text.startswith(f"{component} was not built against torch==9.9.9"), text
    assert "built for torch versions:" in text
    sys.modules.pop(f"mooncake.{module}", None)


def test_built_versions_lists_the_pg_module():
    # The build produces pg_<suffix> for the installed torch.
    version = torch.__version__.split("+")[0]
    assert version in _loader.built_versions("pg")


def test_ep_under_other_torch_version_keeps_the_api_and_names_it(monkeypatch):
    # mooncake.ep falls back to the collective path without a matching runtime,
    # so a mismatch is reported as the reason the fast path is off.
    monkeypatch.setattr(torch, "__version__", "9.9.9+fake")
    monkeypatch.setattr("mooncake._ep_runtime._state", None)
    sys.modules.pop("mooncake.ep", None)
    ep = importlib.import_module("mooncake.ep")
    reason = ep.FAST_PATH_UNAVAILABLE_REASON
    assert not ep.FAST_PATH_AVAILABLE
    assert "Mooncake EP runtime was not built against torch==9.9.9" in reason, reason
    assert "built for torch versions:" in reason
    sys.modules.pop("mooncake.ep", None)
