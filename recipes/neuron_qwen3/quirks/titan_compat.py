"""torchtitan names that moved, imported under their 0.3.0 home first and their old home second.

Only renames with a clear old name live here. The recipes target torchtitan 0.3.0 (`TORCHTITAN=pypi`); an older
torchtitan, such as the torchtitan-neuron fork labelled 0.2.2 (`TORCHTITAN=neuron`), may still have the old ones.
The image build (ci/image/config-check.py) builds every config function, so whatever else such a torchtitan lacks
fails `make image`, not the first run on the cluster.
"""

try:  # torchtitan 0.3.0: the LR schedulers moved into the optimizer package (upstream main, 2026-08-17)
    from torchtitan.components.optimizer import LRSchedulersContainer
except ImportError:  # before: torchtitan/components/lr_scheduler.py
    from torchtitan.components.lr_scheduler import LRSchedulersContainer

__all__ = ["LRSchedulersContainer"]
