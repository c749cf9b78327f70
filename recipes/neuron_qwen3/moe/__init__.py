"""The nki_moe experts: `experts.py` (the torchtitan module, its op and override), `reference.py` (the op in
PyTorch), `layout.py` (nkilib's block layout and weight packing), `nki_kernels.py` (the Neuron seam)."""
