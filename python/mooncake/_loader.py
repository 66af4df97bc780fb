"""Loads the extension module built for the running torch version."""

import glob
import importlib
import os
import re

import torch


def torch_version_suffix(version=None):
    """'2.11.0+cu130' -> '2_11_0'."""
    version = version or torch.__version__
    base = version.split("+")[0]
    return "_".join(base.split(".")[:3])


def built_versions(base):
    """Torch versions for which `base` modules exist next to this file."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = set()
    for path in glob.glob(os.path.join(here, f"{base}_*.so")):
        m = re.match(rf"{base}_(\d+)_(\d+)_(\d+)", os.path.basename(path))
        if m:
            found.add(".".join(m.groups()))
    return sorted(found)


def load_versioned(base, component):
    """Imports mooncake.<base>_<suffix>; ImportError naming the built versions."""
    suffix = torch_version_suffix()
    name = f"mooncake.{base}_{suffix}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        version = torch.__version__.split("+")[0]
        built = built_versions(base)
        listing = ", ".join(built) if built else "none (run `python setup.py build_ext --inplace`)"
        raise ImportError(
            f"{component} was not built against torch=={version}; "
            f"built for torch versions: {listing}"
        ) from None
