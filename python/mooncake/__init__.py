"""Mooncake PG (torch.distributed backends `mooncake`, `mooncake-cpu`) and EP."""

__version__ = "0.1.0"
