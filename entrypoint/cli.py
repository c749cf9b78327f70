"""`python -m entrypoint`: read the environment, find the devices, plan one torchrun command, run it.

Configuration comes only from the environment (see `--help`), so `docker run -e VARIANT=nki_moe IMAGE` is the
whole interface; the flags only inspect. A launch goes: plan -> preflight (preflight.py) -> model assets at full
scale (fetch_assets.py) -> the checkpoint to resume from (checkpoints.py) -> torchrun (launch.py).
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
    cli.add_argument("--self-test", action="store_true",
                     help="on a trn2: devices, runtime, the NKI MoE kernels, a few native steps; one verdict line each")
    return cli


def say(text, token, stream=None):
    """One line: errors and warnings on stderr (the default), progress on stdout with the launch line."""
    print(f"entrypoint: {contract.redact(text, token)}", file=stream or sys.stderr, flush=True)


def prepare(resolved, settings, token) -> int:
    """Everything between the plan and torchrun; 0 to go on, else the launcher's exit status."""
    from entrypoint import checkpoints, fetch_assets, preflight  # the launch path only: --dry-run stays lean

    findings = preflight.run(resolved, settings, os.environ)
    failures = [f.text for f in findings if f.fatal and settings.preflight == "strict"]
    if failures:  # only the reasons it stops: one line each, nothing else
        for text in failures:
            say(text, token)
        return 2
    for finding in findings:
        say(f"warning: {finding.text}", token)
    if resolved.assets and fetch_assets.missing(resolved.assets):
        repo = VARIANTS[settings.variant].hf_repo
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (plan.REPO, os.environ.get("PYTHONPATH"))))}
        code = launch.run([sys.executable, "-m", "entrypoint.fetch_assets", repo, resolved.assets], env,
                          settings.stop_grace)
        if code:
            return code
    elif resolved.assets:
        say(f"assets: {resolved.assets} has {', '.join(fetch_assets.REQUIRED)}: not fetching", token, sys.stdout)
    if resolved.checkpoint_dir:
        latest, warnings = checkpoints.prepare(resolved.checkpoint_dir, resolved.rendezvous.node_rank)
        for text in warnings:
            say(f"warning: {text}", token)
        say(f"checkpoints: resuming from step {latest} in {resolved.checkpoint_dir}" if latest is not None else
            f"checkpoints: none complete in {resolved.checkpoint_dir}: starting at step 0", token, sys.stdout)
    return 0


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
        if args.self_test:  # recipes/neuron_qwen3/selftest.py, in a child: the launcher never imports torch
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (plan.RECIPES, plan.REPO,
                                                                               os.environ.get("PYTHONPATH"))))}
            return launch.run([sys.executable, "-m", "neuron_qwen3.selftest"], env, settings.stop_grace)
        resolved = plan.build(settings, discovery.discover(settings), os.environ)
    except contract.UsageError as error:
        say(str(error), token)
        return 2
    if args.dry_run:
        print(contract.redact(json.dumps(asdict(resolved), indent=2), token))
        return 0
    try:
        code = prepare(resolved, settings, token)
    except (contract.UsageError, OSError) as error:  # e.g. a checkpoint that cannot be moved aside
        say(str(error), token)
        return 2
    if code:
        return code
    line = shlex.join([f"{name}={value}" for name, value in resolved.env.items()] + list(resolved.argv))
    print(f"entrypoint: {contract.redact(line, token)}", flush=True)
    return launch.run(resolved.argv, {**os.environ, **resolved.env}, settings.stop_grace)
