"""`python -m entrypoint`: read the environment, find the devices, plan one torchrun command, run it.

Configuration comes only from the environment (see `--help`), so `docker run -e VARIANT=nki_moe IMAGE` is the
whole interface; the flags only inspect.
"""

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict

from entrypoint import contract, discovery, launch, plan
from entrypoint.variants import VARIANTS


def parser():
    table = "\n".join(f"  {var.name:<25} default {var.default or '-'!s:<12} {var.meaning}" for var in contract.VARS)
    cli = argparse.ArgumentParser(
        prog="python -m entrypoint", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train Qwen3 with torchtitan on whatever this container sees: Neuron, CUDA or CPU.",
        epilog=f"environment:\n{table}")
    cli.add_argument("--dry-run", action="store_true", help="print the resolved plan as JSON and exit")
    cli.add_argument("--list", action="store_true", help="list the variants and their config functions")
    return cli


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for variant in VARIANTS.values():
            configs = ", ".join(f"{scale}={name}" for scale, name in variant.configs.items())
            print(f"{variant.name:<8} {variant.summary} [{configs}]")
        return 0
    token = os.environ.get("HF_TOKEN")
    try:
        settings = contract.parse(os.environ)
        resolved = plan.build(settings, discovery.discover(settings), os.environ)
        if not args.dry_run:
            plan.check_runtime(resolved)
    except contract.UsageError as error:
        print(f"entrypoint: {contract.redact(str(error), token)}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(contract.redact(json.dumps(asdict(resolved), indent=2), token))
        return 0
    line = shlex.join([f"{name}={value}" for name, value in resolved.env.items()] + list(resolved.argv))
    print(f"entrypoint: {contract.redact(line, token)}", flush=True)
    return launch.run(resolved.argv, {**os.environ, **resolved.env})
