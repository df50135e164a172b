"""Tolerances for float32 results that were computed in different ways.

Tests must pass on any x86_64 CPU, Intel or AMD. Results computed the same way are compared
bit for bit. Two *different* computations of the same float32 quantity -- sequential against
vectorized training, float32 against a float64 reference, batched products of other shapes
(another group or batch), another grouping of a sum -- round differently, and by how much
depends on the CPU: MKL, OpenBLAS and oneDNN pick their blocking, summation order and vector
width per CPU, so two such results can be several ulps apart on one machine and identical on
another. They are compared at a number of float32 ulps of the values' size, never at a fixed
absolute number: an atol of 1e-6 is 8 ulps of a weight of 1 but a seventh of one ulp of a
weight of 60. Each test says why its number of ulps.
"""

from __future__ import annotations

import numpy as np

F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: the float32 ulp of 1; eps * |x| >= ulp(x)

# Local SGD computed two ways (sequential against vectorized, float32 against float64): each
# step rounds the gradient's sums, the update and the new weights, and the two ways round
# each of them differently -- up to about 1 ulp of the weights' size apiece, so a few ulps a
# step, which add up over the steps (weights and rounding errors grow alike where SGD
# diverges, so the error relative to the weights stays this size). 4 ulps a step, and one
# step more for the delta's own rounding (y - x): ULPS_PER_STEP * (steps + 1). A real bug
# (a wrong formula, a missing term) is off by 1e-3 of the values or more: thousands of ulps.
ULPS_PER_STEP = 4


def magnitude(*values) -> float:
    """The largest |x| over ``values`` (arrays, tensors, numbers)."""
    out = 0.0
    for v in values:
        if hasattr(v, "detach"):  # a torch tensor
            v = v.detach().cpu().double().numpy()
        out = max(out, float(np.max(np.abs(np.asarray(v, dtype=np.float64)), initial=0.0)))
    return out


def f32_atol(*values, ulps: float) -> float:
    """``ulps`` float32 ulps of the largest |x| in ``values``: an absolute tolerance for
    values of that size (ulps * eps * max|x|)."""
    return ulps * F32_EPS * magnitude(*values)


def merge_ulps(rounds: int) -> int:
    """Ulps between runs whose clients' float32 arithmetic is the same but whose float64
    partial sums are merged in another grouping (another worker count, another order of the
    same clients): the float64 results differ by ~1e-16 relative, so rounding the new weights
    to float32 can flip a last bit in a round (1 ulp of that weight at most), which the later
    rounds carry at about its size: one per round, and one to spare."""
    return rounds + 1
