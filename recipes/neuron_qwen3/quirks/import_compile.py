"""torchtitan 0.3.0 calls `torch.compile` on flex attention while its attention module is imported (the class body
of `FlexAttention` in torchtitan/models/common/attention.py), and that imports Dynamo's and Inductor's compile
machinery: about 1.5 s of every process that imports torchtitan's models. The pre-launch pass builds configs and
never runs a model, so in that process alone `deferred()` makes `torch.compile` wrap its function and compile at
the first call, which never comes there.
"""

import functools


def deferred() -> None:
    """Before torchtitan is imported: `torch.compile(fn, **options)` compiles on fn's first call."""
    import torch

    real = torch.compile

    def compile_later(model=None, **options):
        if model is None:  # used as @torch.compile(...)
            return lambda fn: compile_later(fn, **options)
        compiled = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)

        return call

    torch.compile = compile_later
