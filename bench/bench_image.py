"""Benchmark the image build: cold build, rebuild after a one-file change in recipes/, size added on top of the base.

    .venv/bin/python -m bench.bench_image            # on the stand-in base (built first if missing)
    .venv/bin/python -m bench.bench_image --base-image IMAGE

Goals (issue "The image"): a recipes/ change rebuilds in under 10 s and reinstalls no package; the image
adds under 1.5 GB to its base (torch excluded: it is the base's). Everything is built from a copy of
the build context in a temporary folder, so the working tree is never touched, and every image the
benchmark made is removed at the end. The numbers are printed and written to build/bench_image.json.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from ci import build_image, standin
from ci.engine import Engine

INSTALL_STEP = "install-packages.sh"


def evidence(result):
    """The build-log lines that show what ran: each step and whether it came from the cache."""
    return [f"{'cached' if cached else f'ran {seconds:5.1f}s'}  {step}" for step, seconds, cached in result.steps]


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--base-image", help="default: the stand-in (ci/standin.py), built if missing")
    args = cli.parse_args(argv)
    started = time.time()
    numbers = {}
    with Engine() as client, tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        if args.base_image:
            base = args.base_image
        else:
            t0 = time.monotonic()
            had = bool(client.images.list(name=standin.tag()))
            base = standin.ensure(client)
            numbers["standin_seconds"] = None if had else round(time.monotonic() - t0, 1)
        context = build_image.copy_context(Path(tmp) / "context")
        shutil.rmtree(context / ".wheelhouse", ignore_errors=True)  # cold: the wheels are downloaded too
        tags = {"cold": f"{build_image.NAME}:bench-cold", "rebuild": f"{build_image.NAME}:bench-rebuild"}
        try:
            cold = build_image.build(
                client, base_image=base, hermetic=True, nocache=True, context=context, tags=[tags["cold"]]
            )
            changed = context / "recipes" / "neuron_qwen3" / "__init__.py"
            changed.write_text(changed.read_text() + f"\n# bench_image.py: one-line change {time.time()}\n")
            rebuild = build_image.build(client, base_image=base, hermetic=True, context=context, tags=[tags["rebuild"]])
            image_size = client.images.get(tags["rebuild"]).attrs["Size"]
            base_size = client.images.get(base).attrs["Size"]
            layers = [
                (step["Size"], step["CreatedBy"])
                for step in client.api.history(tags["rebuild"])
                if step["Size"] and step["CreatedBy"] not in {s["CreatedBy"] for s in client.api.history(base)}
            ]
            install = [line for line in evidence(rebuild) if INSTALL_STEP in line]
            numbers.update(
                {
                    "base_image": base,
                    "cold_build_seconds": round(cold.seconds, 1),
                    "cold_build_steps": len(cold.steps),
                    "rebuild_seconds": round(rebuild.seconds, 1),
                    "rebuild_steps_run": [step for step, _, cached in rebuild.steps if not cached],
                    "rebuild_packages_cached": bool(install) and all(line.startswith("cached") for line in install),
                    "image_bytes": image_size,
                    "base_bytes": base_size,
                    "added_bytes": image_size - base_size,
                    "added_layers": [{"bytes": size, "step": step[:120]} for size, step in layers],
                }
            )
            print("\nrebuild after a one-line change in recipes/neuron_qwen3/__init__.py:")
            print("\n".join("  " + line for line in evidence(rebuild)))
        finally:
            for tag in tags.values():
                try:
                    client.images.remove(tag, force=True)
                except Exception:  # the build failed before tagging
                    pass
            for image in client.images.list(filters={"dangling": True}):  # the bench's own untagged stages
                created = image.attrs["Created"][:19]
                if time.strptime(created, "%Y-%m-%dT%H:%M:%S") >= time.gmtime(started - 1):
                    client.images.remove(image.id, force=True)
    goals = {
        "rebuild under 10 s": numbers["rebuild_seconds"] < 10,
        "no package reinstalled on rebuild": numbers["rebuild_packages_cached"],
        "adds under 1.5 GB": numbers["added_bytes"] < 1.5e9,
    }
    numbers["goals"] = goals
    built = numbers.get("standin_seconds")
    print(f"\nbase {numbers['base_image']}" + (f" (built in {built} s)" if built else ""))
    print(f"cold build (wheelhouse download + no-cache build): {numbers['cold_build_seconds']:6.1f} s")
    packages = "cached" if goals["no package reinstalled on rebuild"] else "REINSTALLED"
    print(
        f"rebuild after one recipes/ file changed:           {numbers['rebuild_seconds']:6.1f} s "
        f"({len(numbers['rebuild_steps_run'])} steps ran, packages {packages})"
    )
    print(
        f"added on top of the base:                          {numbers['added_bytes'] / 1e6:6.0f} MB "
        f"(image {image_size / 1e9:.2f} GB, base {base_size / 1e9:.2f} GB)"
    )
    for layer in numbers["added_layers"]:
        print(f"    {layer['bytes'] / 1e6:8.1f} MB  {layer['step']}")
    for goal, met in goals.items():
        print(f"goal: {goal}: {'met' if met else 'MISSED'}")
    out = REPO / "build" / "bench_image.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(numbers, indent=2))
    print(f"written to {out.relative_to(REPO)}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
