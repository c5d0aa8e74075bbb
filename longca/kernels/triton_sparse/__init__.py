"""longca's own Triton block-sparse attention (forward and backward, GQA, uniform or variable blocks).

- plan.py: BlockLayout -> device index tables (CSR per KV head and query block, its transpose,
  tile tables); pure torch/numpy, importable without Triton.
- forward.py / backward.py: the Triton kernels and their launchers.
- api.py: the public functions (forward with LSE, backward from a given (out, lse)) and the
  autograd wrapper.
"""
