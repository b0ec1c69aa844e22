"""The intra-tile layouts of block-sparse weights (:mod:`.block_sparse`), without torch: the export settings check
``export.sparse_layout`` against them on installs that have no torch."""

from __future__ import annotations

LAYOUTS = ("plain", "transposed")  # plain: (nnz, block_n, block_k), N-major; transposed: (nnz, block_k, block_n)
