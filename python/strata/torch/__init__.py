# SPDX-License-Identifier: Apache-2.0
"""strata for PyTorch: OffloadAdam, a torch.optim.Optimizer whose Adam state
lives in a strata tier store (host memory or NVMe) and is updated by
strata's SIMD CPU Adam (offload_adam.py says how to use it).

    import strata.torch
    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4)

Importing this module needs torch; `import strata` alone does not.
"""

try:
    import torch as _torch  # noqa: F401  (the dependency, named in the error below)
except ImportError as e:
    raise ImportError("strata.torch needs PyTorch (pip install torch, or Debian's python3-torch): %s" % e) from e

from .offload_adam import OffloadAdam

__all__ = ["OffloadAdam"]
