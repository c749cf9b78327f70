"""Write image-build.lock: what this image was built with, which the launcher's preflight checks against.

Run by the Dockerfile as `python3 tools/record-build.py TORCHTITAN > image-build.lock`. A docker LABEL is not
visible inside the container, so the build records it here: the TORCHTITAN build arg, and the installed versions
of the base's torch and torch-neuronx (which no lock pins: they come with the Neuron DLC) and of torchtitan and
transformers (the fork replaces torchtitan's 0.3.0 pin). Same `name==version` format as the locks.
"""

import importlib.metadata
import sys

PACKAGES = ("torch", "torch-neuronx", "torchtitan", "transformers")


def main(torchtitan: str) -> int:
    print(f"# written at image build by ci/image/record-build.py\n# TORCHTITAN={torchtitan}")
    for name in PACKAGES:
        try:
            print(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass  # torch-neuronx on the stand-in base
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
