"""`python -m entrypoint`: read the environment, find the devices, plan one torchrun command, run it.

The environment is the interface (`--help`); the launcher's own flags only inspect, every other argument goes to
torchtitan after EXTRA_ARGS, as run_train.sh passes "$@". A launch: plan, the stdlib checks (preflight.py), the
assets (a child), the lease (lease.py), the recipes' pre-launch pass (a child), torchrun (launch.py).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict

from entrypoint import contract, discovery, hygiene, launch, plan, preflight
from entrypoint.variants import RECIPE_MODULE, VARIANTS


def parser():
    table = "\n".join(
        f"  {var.name}  (default: {var.default or '-'}; accepts: {var.allowed}"
        f"{'; sets ' + var.flag if var.flag else ''})\n      {var.meaning}"
        for var in contract.VARS
    )
    cli = argparse.ArgumentParser(
        prog="python -m entrypoint",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        usage="%(prog)s [--dry-run | --check | --list | --self-test] [torchtitan arguments ...]",
        description="Train Qwen3 with torchtitan on whatever this container sees: Neuron, CUDA or CPU. Arguments "
        "other than these flags go to torchtitan after EXTRA_ARGS (e.g. --training.steps 5).",
        epilog=f"environment:\n{table}",
    )
    cli.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and the torchtitan config that would run, as JSON, and exit",
    )
    cli.add_argument(
        "--check",
        action="store_true",
        help="the plan and every preflight check; starts and creates nothing; exit 0 if it would launch",
    )
    cli.add_argument("--list", action="store_true", help="list the variants and the Qwen3 models MODEL accepts")
    cli.add_argument(
        "--self-test",
        action="store_true",
        help="on a trn2: devices, runtime, the NKI MoE kernels, a few native steps; one verdict line each",
    )
    return cli


def print_list() -> int:
    for variant in VARIANTS.values():
        configs = ", ".join(f"{scale}={name}" for scale, name in variant.configs.items())
        print(f"{variant.name:<8} {variant.summary} [{configs}; MODEL: {variant.model_config}]", flush=True)
    print("\nMODEL (SCALE=full):", flush=True)
    return subprocess.run([sys.executable, "-m", f"{RECIPE_MODULE}.shapes"]).returncode


def say(text, environ, stream=None):
    """One line: errors and warnings on stderr (the default), progress on stdout with the launch line."""
    print(f"entrypoint: {hygiene.redact(text, environ)}", file=stream or sys.stderr, flush=True)


def reported(findings, settings, environ, lines=()) -> int:
    """Print the findings (a failure alone, without the warnings), then `lines` on stdout: 2 if a failure stops."""
    failures = [f.text for f in findings if f.fatal and settings.preflight == "strict"]
    for text in failures or [f"warning: {f.text}" for f in findings]:
        say(text, environ)
    for line in lines:
        say(line, environ, sys.stdout)
    return 2 if failures else 0


def dry_run(resolved, settings, environ) -> int:
    findings, answer = preflight.recipes_pass(resolved, environ, print_config=True, check_files=False)
    if reported([f for f in findings if f.fatal], settings, environ) or not answer:
        return 2
    shown = {
        **asdict(resolved),
        "model_size": answer["model"],
        "notes": answer["lines"],
        "torchtitan_config": answer["config"],
    }
    print(hygiene.redact(json.dumps(shown, indent=2), environ))
    return 0


def check(resolved, settings, environ, root) -> int:
    findings = preflight.run(resolved, settings, environ, root)
    fetched = (
        subprocess.run(
            preflight.fetch_argv(resolved, settings, check=True), env=hygiene.child_env(environ, fetch=True)
        ).returncode
        if resolved.assets
        else 0
    )
    pending = settings.init_from == "hub" and fetched == 3  # the weights come at launch: nothing to read yet
    more, answer = preflight.recipes_pass(resolved, environ, check_files=not pending)
    code = reported(findings + more, settings, environ, answer.get("lines", ())) or (2 if fetched not in (0, 3) else 0)
    say(
        f"check: {'the launch would start' if not code else 'the launch would stop'}: {resolved.config} on "
        f"{resolved.nproc} {plan.UNIT[resolved.devices.kind]}",
        environ,
        sys.stdout,
    )
    return code


def prepare(resolved, settings, environ, root, held: ExitStack) -> int:
    """Everything between the plan and torchrun: 0 to go on, else the exit status; a lease lasts while `held`."""
    from entrypoint import lease

    findings = preflight.run(resolved, settings, environ, root)  # warnings after the fetch: a failure comes alone
    code = reported([f for f in findings if f.fatal], settings, environ)
    if not code and resolved.assets:
        code = launch.run(
            preflight.fetch_argv(resolved, settings), hygiene.child_env(environ, fetch=True), settings.stop_grace
        )
    if code:
        return code
    reported([f for f in findings if not f.fatal], settings, environ)
    if resolved.checkpoint_dir and resolved.rendezvous.node_rank == 0:
        taken = lease.Lease(resolved.checkpoint_dir, settings.rdzv_id or settings.slurm_job_id)
        taken_over = taken.take()
        held.callback(taken.release)
        if taken_over:
            say(f"warning: {taken_over}", environ)
    findings, answer = preflight.recipes_pass(resolved, environ, fix=True)
    return reported(findings, settings, environ, answer.get("lines", ()))


def self_test(settings, environ, root) -> int:
    """`--self-test`: the devices found here, then the checks that need torch in a child
    (neuron_qwen3/prelaunch/selftest.py)."""
    devices = discovery.discover(settings, root)
    if devices.kind != "neuron":
        print(
            f"self-test: no Neuron devices here (found {devices.kind}): this is not a Trainium host; run it on a "
            "trn2 with `docker run --device=/dev/neuron0 ... IMAGE --self-test`",
            flush=True,
        )
        return 2
    print(
        f"self-test: PASS devices: {len(devices.nodes)} Neuron devices, {devices.count} logical NeuronCores at "
        f"LNC {devices.lnc}",
        flush=True,
    )
    return launch.run([sys.executable, "-m", f"{RECIPE_MODULE}.prelaunch.selftest"], dict(environ), settings.stop_grace)


def main(argv=None, environ=None, root="/") -> int:
    """`root`: where discovery and the /dev checks look (tests give a fake /dev)."""
    environ = os.environ if environ is None else environ
    launched_at = time.time()
    args, torchtitan_args = parser().parse_known_args(argv)
    if args.list:
        return print_list()
    if not args.dry_run:
        launch.watch()  # a stop from here on (discovery, neuron-ls, preflight, the fetch) starts nothing more
    for line in hygiene.stray_names(environ):
        say(f"warning: {line}", environ)
    try:
        settings = contract.parse(environ)
        if args.self_test:
            return self_test(settings, environ, root)
        resolved = plan.build(
            settings,
            discovery.discover(settings, root),
            environ,
            torchtitan_args,
            None if args.dry_run or args.check else launched_at,
        )
    except contract.UsageError as error:
        say(str(error), environ)
        return launch.stop_status() or 2
    if args.dry_run:
        return dry_run(resolved, settings, environ)
    if args.check:
        return check(resolved, settings, environ, root)
    with ExitStack() as held:
        try:
            code = prepare(resolved, settings, environ, root, held)
        except (contract.UsageError, OSError) as error:  # e.g. a lease held by a live job
            say(str(error), environ)
            return launch.stop_status() or 2
        if code or launch.stop_status():
            return launch.stop_status() or code
        line = shlex.join([f"{name}={value}" for name, value in resolved.env.items()] + list(resolved.argv))
        say(line, environ, sys.stdout)
        peer = (resolved.rendezvous.endpoint, settings.peer_timeout) if resolved.rendezvous.node_rank else None
        workers = {**hygiene.child_env(environ), **resolved.env}
        return launch.run(resolved.argv, workers, settings.stop_grace, peer)
