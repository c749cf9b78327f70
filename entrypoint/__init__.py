"""The container's launcher: environment in, one torchrun command out, signals passed through.

    python -m entrypoint              # train VARIANT at SCALE on every core found (Neuron, CUDA or CPU)
    python -m entrypoint --dry-run    # print the plan as JSON instead
    VARIANT=nki_moe SCALE=smoke STEPS=5 python -m entrypoint

contract.py (the variables), discovery.py (the devices), plan.py (the command), launch.py (the child), cli.py.
"""
