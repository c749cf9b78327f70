"""The MoE layers: `experts.py` (the nki_moe torchtitan module, its op and override), `reference.py` (the op in
PyTorch), `layout.py` (nkilib's block layout and weight packing), `nki_kernels.py` (the Neuron seam),
`routing.py` (every MoE variant's router losses and the experts' load)."""
