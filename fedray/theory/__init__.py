"""Closed-form theory that the simulator's experiments are checked against.

Pure NumPy (float64); importing this package starts neither Ray nor torch.

- :mod:`fedray.theory.surrogate`: local update methods on quadratic clients are, in
  expectation, the server optimizer applied to a *surrogate* loss (seed 002, Charles &
  Konečný); its distortion matrices, condition numbers, convergence rates, suboptimality and
  the (rate, suboptimality) Pareto frontiers.
"""

from fedray.theory import surrogate

__all__ = ["surrogate"]
