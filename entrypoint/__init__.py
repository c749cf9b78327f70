"""The container's launcher: environment in, one torchrun command out, signals passed through (cli.py)."""
