"""The container's launcher: environment in, one torchrun command out, signals passed through.

    python -m entrypoint              # train VARIANT at SCALE on every core found (Neuron, CUDA or CPU)
    python -m entrypoint --dry-run    # print the plan as JSON instead
    VARIANT=nki_moe SCALE=smoke STEPS=5 python -m entrypoint

contract.py (the variables), discovery.py (the devices), rendezvous.py (the nodes), plan.py (the command),
preflight.py (the checks), fetch_assets.py (full-scale assets, in a child process), checkpoints.py (where to
resume), launch.py (the child and the stop bound), cli.py. docs/production.md: multi-node, preemption, caches.
"""
