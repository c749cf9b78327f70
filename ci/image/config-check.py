"""Build every config function the variant table names, at image build: a torchtitan the recipes do not fit fails here.

Run by the Dockerfile after `COPY entrypoint/ recipes/`, for both TORCHTITAN values (pypi: upstream 0.3.0; neuron:
the torchtitan-neuron fork), offline and without a device: importing the recipes and building a config only
constructs dataclasses. A missing override registry (torchtitan.config.override, which the nki_moe variant swaps
its experts through) is one line, not a failure: the other variants still run.
"""

import importlib
import importlib.metadata
import sys
import traceback


def main() -> int:
    from entrypoint.variants import RECIPE_MODULE, VARIANTS

    version = importlib.metadata.version("torchtitan")
    try:
        registry = importlib.import_module(f"{RECIPE_MODULE}.config_registry")
    except Exception:
        print(f"config-check: FAILED: the recipes do not import on torchtitan {version}:\n"
              f"{traceback.format_exc(limit=4)}", file=sys.stderr)
        return 1
    try:
        importlib.import_module("torchtitan.config.override")
        has_overrides = True
    except ImportError:
        has_overrides = False
    failures, built = [], 0
    for variant in VARIANTS.values():
        for scale, name in variant.configs.items():
            try:
                config = getattr(registry, name)()
                for entry in config.override.imports if has_overrides else ():
                    module, _, function = (entry[0] if isinstance(entry, tuple) else entry).rpartition(".")
                    getattr(importlib.import_module(module), function)
                built += 1
            except Exception as error:
                failures.append(f"{variant.name} {scale} ({name}): {type(error).__name__}: {error}")
    if not has_overrides:
        print(f"config-check: torchtitan {version} has no override registry (torchtitan.config.override): "
              "VARIANT=nki_moe cannot run in this image")
    if failures:
        print(f"config-check: FAILED on torchtitan {version}:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"config-check: {built} config functions build on torchtitan {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
