"""Compression group: pruning and low-rank factorization, each registered in COMPRESSION."""

from turbotrain.compression import lowrank, prune  # each registers its methods
from turbotrain.compression.compress import (
    COMPRESSION,
    CompressionConfig,
    apply_compression,
    record_structure,
    restore_structure,
    structure_keys,
)

__all__ = [
    "COMPRESSION",
    "CompressionConfig",
    "apply_compression",
    "lowrank",
    "prune",
    "record_structure",
    "restore_structure",
    "structure_keys",
]
