"""Linear and subquadratic attention: references, FLOP models and families as data.

- ``reference``: exact recurrent (ground truth) and chunked float64 forms of each family.
- ``flops``: the documented FLOP models of the chunked and recurrent algorithms (``flop_model``).
- ``families``: each family's extra inputs (gates, beta) and references.

The kernels themselves (flash-linear-attention) are adapted in
``longca.kernels.adapters.linear_fla``. A prepared linear kernel carries, in
``Prepared.extra``, everything the runner needs that differs from softmax attention:
``reference`` (q, k, v) -> float64 output, ``flop_model`` and ``flops`` per pass.
"""

from longca.kernels.linear.families import FAMILIES, LinearFamily, make_extra
from longca.kernels.linear.flops import CHUNK, MODELS, linear_flops

__all__ = ["CHUNK", "FAMILIES", "MODELS", "LinearFamily", "linear_flops", "make_extra"]
