"""Document-causal attention that needs no Inductor: `masks.py` (a packed window's documents, built eagerly),
`reference.py` (the maths in PyTorch, in query blocks), `nki_kernels.py` (the Neuron seam: nkilib's training
attention kernels), `document.py` (the torch op, its autograd, torchtitan's module and transformers' function)."""
