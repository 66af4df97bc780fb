"""Mooncake EP: MoE dispatch/combine over a process group.

``Buffer`` and ``EventOverlap`` (see ``mooncake.mooncake_ep_buffer``) work in
every build. The CUDA fast path needs the compiled runtime
(``mooncake.ep_<torch version>``); without it every Buffer runs the fallback
over the group's collectives, and ``FAST_PATH_UNAVAILABLE_REASON`` says why.
A runtime built for another torch version is reported here too (the loader's
version check), not silently ignored.
"""

from mooncake import _ep_runtime
from mooncake.mooncake_ep_buffer import Buffer, EPRankFailure, EventOverlap

FAST_PATH_UNAVAILABLE_REASON = _ep_runtime.unavailable_reason()
FAST_PATH_AVAILABLE = FAST_PATH_UNAVAILABLE_REASON is None

__all__ = [
    "Buffer",
    "EPRankFailure",
    "EventOverlap",
    "FAST_PATH_AVAILABLE",
    "FAST_PATH_UNAVAILABLE_REASON",
]
