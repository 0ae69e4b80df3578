"""multicard: repeated, verifiable re-runs of the experiments of arXiv 2505.22905.

Kept free of heavy imports: `multicard plan`, `report` and `verify` must work without torch.
"""

__version__ = "0.1.0"
