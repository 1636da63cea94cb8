"""pagoda.kernels: Triton GPU kernels, each beside a pure-torch reference.

Callers use `pagoda.kernels.ops`, which picks the Triton kernel for CUDA tensors and the reference
otherwise. Tests run the Triton kernels on the CPU under TRITON_INTERPRET=1 against the references.
"""
