"""Import smoke test of the image's Python closure; any failure fails `docker build`.

Run by install-packages.sh as `$VENV/bin/python import-check.py requirements.lock`. Checks that
  - torch is the base image's own (not installed by the lock), and still imports;
  - every distribution the lock pins for this Python is installed at exactly the pinned version
    and is the copy Python finds first (a base copy at another version is shadowed);
  - every top-level module those distributions ship imports, and so do the modules the three
    variants train through (torchtitan.train, the qwen3 model, the transformers backend).
All failures are reported together.
"""

import importlib
import importlib.metadata as metadata
import re
import sys
import sysconfig
import time
import traceback

from packaging.markers import Marker
from packaging.utils import canonicalize_name

# What the variants import on their way to training (see recipes/neuron_qwen3/config_registry.py).
KEY_MODULES = (
    "torch",
    "torch.distributed.run",
    "torchtitan.train",
    "torchtitan.models.qwen3",
    "torchtitan.experiments.transformers_modeling_backend.config_registry",
    "transformers.models.qwen3.modeling_qwen3",
    "datasets",
    "tokenizers",
    "safetensors.torch",
    "huggingface_hub",
)
# Top-level names a distribution ships that are not meant to be imported on their own.
NOT_MODULES = {
    "tensorboard_data_server": "a binary server package, loaded by tensorboard on demand",
}


def pinned(lock_path):
    """(name, version) of each requirement of the hashed lock whose marker holds for this Python."""
    text = re.sub(r"\\\n\s*", " ", open(lock_path).read())  # join continuation lines
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement, _, marker = line.partition(";")
        marker = marker.split("--hash", 1)[0].strip()
        name, _, version = requirement.split("--hash", 1)[0].strip().partition("==")
        if not marker or Marker(marker).evaluate():
            yield canonicalize_name(name), version


def top_level_modules(dist):
    text = dist.read_text("top_level.txt")
    if text:
        names = text.split()
    else:  # no top_level.txt (flit, hatch, maturin wheels): derive from the RECORD
        names = set()
        for path in dist.files or ():
            first = path.parts[0]
            if first.endswith((".dist-info", ".data")) or first in ("..", "bin"):
                continue
            if len(path.parts) > 1:  # a package directory
                names.add(first)
            elif first.endswith((".py", ".so")):  # a module, pure or compiled
                names.add(first.split(".")[0])
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_") and n not in NOT_MODULES)


def main(lock_path):
    failures = []
    venv_site = sysconfig.get_path("purelib")
    modules = list(KEY_MODULES)
    for name, version in pinned(lock_path):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            failures.append(f"{name}=={version}: not installed")
            continue
        if dist.version != version:
            failures.append(f"{name}: Python finds {dist.version} at {dist.locate_file('')}, the lock pins {version}")
        modules += [m for m in top_level_modules(dist) if m not in modules]

    start = time.monotonic()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # report every failure, not only the first
            failures.append(f"import {module}:\n{traceback.format_exc(limit=3)}")
    import torch

    if torch.__file__.startswith(venv_site):
        failures.append(f"torch was installed into the image's venv ({torch.__file__}): it must come from the base")
    if failures:
        print("import-check: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(
        f"import-check: {len(modules)} modules import in {time.monotonic() - start:.1f}s; "
        f"torch {torch.__version__} from the base ({torch.__file__})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
