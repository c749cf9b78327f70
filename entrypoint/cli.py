"""`python -m entrypoint`: read the environment, find the devices, plan one torchrun command, run it.

Configuration comes from the environment (see `--help`), so `docker run -e VARIANT=nki_moe IMAGE` is the whole
interface; the launcher's own flags only inspect, and every other argument goes to torchtitan after EXTRA_ARGS, as
torchtitan's run_train.sh passes "$@" (`docker run IMAGE --training.steps 5`). A launch goes: plan -> preflight
(preflight.py) -> model assets at full scale (fetch_assets.py) -> the checkpoint to resume from (checkpoints.py) ->
torchrun (launch.py).
"""

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict

from entrypoint import contract, discovery, launch, models, plan
from entrypoint.variants import VARIANTS

SECRETS = ("HF_TOKEN",)  # given to the asset fetch, never to torchrun and the workers


def parser():
    table = "\n".join(f"  {var.name}  (default: {var.default or '-'}; accepts: {var.allowed})\n      {var.meaning}"
                      for var in contract.VARS)
    cli = argparse.ArgumentParser(
        prog="python -m entrypoint", formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="%(prog)s [--dry-run | --check | --list] [torchtitan arguments ...]",
        description="Train Qwen3 with torchtitan on whatever this container sees: Neuron, CUDA or CPU. Arguments "
                    "other than these flags go to torchtitan after EXTRA_ARGS (e.g. --training.steps 5).",
        epilog=f"environment:\n{table}")
    cli.add_argument("--dry-run", action="store_true", help="print the resolved plan as JSON and exit")
    cli.add_argument("--check", action="store_true",
                     help="the plan and every preflight check; starts and creates nothing; exit 0 if it would launch")
    cli.add_argument("--list", action="store_true", help="list the variants and the Qwen3 models MODEL accepts")
    cli.add_argument("--self-test", action="store_true",
                     help="on a trn2: devices, runtime, the NKI MoE kernels, a few native steps; one verdict line each")
    return cli


def print_list():
    for variant in VARIANTS.values():
        configs = ", ".join(f"{scale}={name}" for scale, name in variant.configs.items())
        print(f"{variant.name:<8} {variant.summary} [{configs}; other MODELs: {variant.any_model_config}]")
    print("\nMODEL (SCALE=full):")
    for name, shape in models.MODELS.items():
        defaults = [v.name for v in VARIANTS.values() if v.hf_repo == name]
        default = f"  default of {', '.join(defaults)}" if defaults else ""
        print(f"  {name:<32} {shape.family:<5} {shape.parameters() / 1e9:6.2f} B{default}")


def say(text, token, stream=None):
    """One line: errors and warnings on stderr (the default), progress on stdout with the launch line."""
    print(f"entrypoint: {contract.redact(text, token)}", file=stream or sys.stderr, flush=True)


def checked(resolved, settings, token, absent) -> int:
    """Preflight: 0 to go on, else 2 after printing the reasons it stops (one line each, nothing else)."""
    from entrypoint import preflight  # the launch path only: --dry-run stays lean

    findings = preflight.run(resolved, settings, os.environ, absent)
    failures = [f.text for f in findings if f.fatal and settings.preflight == "strict"]
    for text in failures:
        say(text, token)
    if failures:
        return 2
    for finding in findings:
        say(f"warning: {finding.text}", token)
    return 0


def prepare(resolved, settings, token, leases) -> int:
    """Everything between the plan and torchrun; 0 to go on, else the launcher's exit status. A lease taken on
    the checkpoint folder is appended to `leases`, for main to release."""
    from entrypoint import checkpoints, fetch_assets, lease, preflight

    absent = preflight.missing_assets(resolved, settings)  # decided once: for the checks and for the fetch
    code = checked(resolved, settings, token, absent)
    if code:
        return code
    weights = settings.init_from == "hub"  # the plan's MODEL's weights too, into the same folder
    if absent:
        repo = resolved.model
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (plan.REPO, os.environ.get("PYTHONPATH"))))}
        if token:  # the only process that needs it; a secret made from a file ends in a newline
            env["HF_TOKEN"] = token.strip()
        code = launch.run([sys.executable, "-m", "entrypoint.fetch_assets", repo, resolved.assets,
                           *(["--weights"] if weights else [])], env, settings.stop_grace)
        if code:
            return code
    elif resolved.assets:
        say(f"assets: {resolved.assets} has {', '.join(fetch_assets.REQUIRED)}: not fetching", token, sys.stdout)
    if resolved.checkpoint_dir and resolved.rendezvous.node_rank == 0:
        leases.append(lease.Lease(resolved.checkpoint_dir, settings.rdzv_id or settings.slurm_job_id))
        taken_over = leases[-1].take()
        if taken_over:
            say(f"warning: {taken_over}", token)
    if resolved.checkpoint_dir:
        latest, warnings = checkpoints.prepare(resolved.checkpoint_dir, resolved.rendezvous.node_rank)
        for text in warnings:
            say(f"warning: {text}", token)
        say(f"checkpoints: resuming from step {latest} in {resolved.checkpoint_dir}" if latest is not None else
            f"checkpoints: none complete in {resolved.checkpoint_dir}: starting at step 0", token, sys.stdout)
    return 0


def main(argv=None) -> int:
    args, torchtitan_args = parser().parse_known_args(argv)
    if args.list:
        print_list()
        return 0
    if not args.dry_run:
        launch.watch()  # a stop from here on (discovery, neuron-ls, preflight, the fetch) starts nothing more
    token = os.environ.get("HF_TOKEN")
    for line in contract.stray_names(os.environ):
        say(f"warning: {line}", token)
    try:
        settings = contract.parse(os.environ)
        if args.self_test:  # recipes/neuron_qwen3/selftest.py, in a child: the launcher never imports torch
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (plan.RECIPES, plan.REPO,
                                                                               os.environ.get("PYTHONPATH"))))}
            return launch.run([sys.executable, "-m", "neuron_qwen3.selftest"], env, settings.stop_grace)
        resolved = plan.build(settings, discovery.discover(settings), os.environ, torchtitan_args)
    except contract.UsageError as error:
        say(str(error), token)
        return launch.stop_status() or 2
    if args.dry_run:
        print(contract.redact(json.dumps(asdict(resolved), indent=2), token))
        return 0
    if args.check:
        from entrypoint import preflight

        code = checked(resolved, settings, token, preflight.missing_assets(resolved, settings))
        say(f"check: {'the launch would start' if not code else 'the launch would stop'}: {resolved.config} on "
            f"{resolved.nproc} {plan.UNIT[resolved.devices.kind]}; {resolved.parallelism['why']}", token, sys.stdout)
        return code
    leases = []
    try:
        return launch_prepared(resolved, settings, token, leases)
    finally:
        for held in leases:
            held.release()


def launch_prepared(resolved, settings, token, leases) -> int:
    try:
        code = prepare(resolved, settings, token, leases)
    except (contract.UsageError, OSError) as error:  # e.g. a checkpoint that cannot be read or moved aside
        say(str(error), token)
        return launch.stop_status() or 2
    if code or launch.stop_status():
        return launch.stop_status() or code
    line = shlex.join([f"{name}={value}" for name, value in resolved.env.items()] + list(resolved.argv))
    print(f"entrypoint: {contract.redact(line, token)}", flush=True)
    workers = {name: value for name, value in os.environ.items() if name not in SECRETS}  # only the fetch needs it
    return launch.run(resolved.argv, {**workers, **resolved.env}, settings.stop_grace)
