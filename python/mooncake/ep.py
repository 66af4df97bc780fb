"""Mooncake EP: loads the EP and PG extension modules built for this torch.

The EP runtime (Buffer, ElasticBuffer) lands in later work; until then this
module only performs the version check, so a mismatch is reported early.
"""

from mooncake._loader import load_versioned

_ep = load_versioned("ep", "Mooncake EP")
