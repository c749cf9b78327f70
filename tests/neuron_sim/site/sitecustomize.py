"""Loads the simulated neuron device at interpreter start when NEURON_SIM=1 (tests only).

Put this folder on PYTHONPATH: every Python process of the run (torchrun and its workers) then has `neuron`
registered before torchtitan is imported, as TorchNeuron's autoload does on a trn2. The package is loaded from
its path under the name `neuron_sim`, without putting tests/ on sys.path.
"""

import os

if os.environ.get("NEURON_SIM") == "1":
    import importlib.util
    import sys
    from pathlib import Path

    _package = Path(__file__).resolve().parent.parent
    if "neuron_sim" not in sys.modules:
        _spec = importlib.util.spec_from_file_location(
            "neuron_sim", _package / "__init__.py", submodule_search_locations=[str(_package)]
        )
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["neuron_sim"] = _module
        _spec.loader.exec_module(_module)
    sys.modules["neuron_sim"].install()
