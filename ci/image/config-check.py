"""Build every config function the variant table names, at image build: a torchtitan the recipes do not fit fails here.

Run by the Dockerfile after the project is installed, for both TORCHTITAN values (pypi: upstream 0.3.0; neuron: the
torchtitan-neuron fork), offline and without a device: importing the recipes and building a config only constructs
dataclasses. Each config that does not build is named with its error; the nki_moe override is imported too.
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
        print(
            f"config-check: FAILED: the recipes do not import on torchtitan {version}:\n"
            f"{traceback.format_exc(limit=4)}",
            file=sys.stderr,
        )
        return 1
    failures, built = [], 0
    for variant in VARIANTS.values():
        for scale, name in variant.configs.items():
            try:
                config = getattr(registry, name)()
                for entry in config.override.imports:
                    module, _, function = (entry[0] if isinstance(entry, tuple) else entry).rpartition(".")
                    getattr(importlib.import_module(module), function)
                built += 1
            except Exception as error:
                failures.append(f"{variant.name} {scale} ({name}): {type(error).__name__}: {error}")
    if failures:
        print(f"config-check: FAILED on torchtitan {version}:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"config-check: {built} config functions build on torchtitan {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
