"""The Neuron worker: `torch_neuronx` first, then the project's trainer main.

torchtitan picks its device once, when `torchtitan.tools.utils` is imported
(`_get_available_device_type() or "cuda"`): unless `torch_neuronx` has registered the `neuron` PrivateUse1
backend by then, torchtitan settles on "cuda". Whether torch-neuronx registers itself through torch's
backend autoload is not documented, so this worker does not depend on it: it imports `torch_neuronx` before
anything imports torchtitan, and stops with one line if it cannot.
"""

import sys


def main() -> None:
    try:
        import torch_neuronx  # noqa: F401  registers the `neuron` device before torchtitan looks for one
    except ImportError as error:
        sys.exit(f"neuron worker: torch_neuronx is not importable ({error}): run the Neuron image on a Trainium host")
    from neuron_qwen3 import trainer

    trainer.main()


if __name__ == "__main__":
    main()
