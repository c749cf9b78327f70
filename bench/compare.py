"""Compare finished runs side by side, or run the three variants alike and compare them.

    python -m bench.compare RUN_DIR RUN_DIR...   each an OUTPUT_DIR (or its report/ folder)
    python -m bench.compare --run [OUT]          `make compare`: every variant through the launcher with this
                                                 environment (SCALE, STEPS, COMPILE, NPROC...), each into
                                                 OUT/<variant> (default $OUTPUT_DIR/compare)

Prints one table (tokens/s, step time, MFU where defined, peak memory, first and last loss, and tokens/s
relative to the first run) and writes one plot of every run's loss curve (`--plot`, default
<common folder>/loss.png). Reads only the reports' files: no torch import, it starts at once.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from neuron_qwen3.report.plots import plot_losses

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ("run", "end", "steps", "tokens/s", "x first", "s/step", "MFU %", "peak GiB", "loss first", "loss last")


def load(folder) -> tuple[dict, list]:
    """(summary, metrics records) of a run folder: an OUTPUT_DIR or its report/ folder."""
    folder = Path(folder)
    report = folder if (folder / "summary.json").exists() else folder / "report"
    summary = json.loads((report / "summary.json").read_text())
    records = [json.loads(line) for line in (report / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summary, [r for r in records if "loss" in r]  # training steps, not validation lines


def label(summary: dict, folder) -> str:
    """`variant` (`+compile` when compiled); the folder's name when the variant is unknown."""
    name = summary.get("variant") or Path(folder).resolve().name
    return name + ("+compile" if summary.get("compile") else "")


def _number(value, digits):
    return "-" if value is None else f"{value:,.{digits}f}"


def table(runs: dict) -> str:
    """A Markdown table, one row per run (`runs`: label -> summary)."""
    first = next(iter(runs.values()), {}).get("tokens_per_s")
    rows = []
    for name, s in runs.items():
        ratio = s["tokens_per_s"] / first if first and s.get("tokens_per_s") else None
        rows.append(
            (
                name,
                s["end"],
                f"{s['steps']['done']}/{s['steps']['planned']}",
                _number(s.get("tokens_per_s"), 1),
                _number(ratio, 2),
                _number(s.get("step_time_s"), 3),
                _number(s["mfu"]["pct"], 2) if s["mfu"]["pct"] is not None else "n/a",
                _number(s.get("peak_memory_gib"), 2),
                _number(s.get("first_loss"), 4),
                _number(s.get("last_loss"), 4),
            )
        )
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    reasons = {s["mfu"]["peak_source"] for s in runs.values() if s["mfu"]["pct"] is None}
    return "\n".join(lines + [f"MFU n/a: {reason}" for reason in sorted(reasons)])


def compare(folders, plot: Path | None = None, stream=None) -> dict:
    runs, curves = {}, {}
    for folder in folders:
        summary, records = load(folder)
        folder = Path(folder).parent if (Path(folder) / "summary.json").exists() else Path(folder)  # the run's
        name = label(summary, folder)
        if name in runs:  # e.g. two runs of one variant: tell them apart by folder
            name = f"{name} ({Path(folder).resolve().name})"
        runs[name], curves[name] = summary, records
    print(table(runs), file=stream or sys.stdout)
    if plot is None:
        plot = Path(os.path.commonpath([str(Path(f).resolve()) for f in folders])) / "loss.png"
    plot_losses(curves, plot)
    print(f"loss curves: {plot}", file=stream or sys.stdout)
    return runs


def run_variants(out: Path) -> list:
    """Each variant through `python -m entrypoint`, one after the other, with this environment."""
    from entrypoint.variants import VARIANTS

    folders = []
    for variant in VARIANTS:
        folder = out / variant
        env = dict(os.environ, VARIANT=variant, OUTPUT_DIR=str(folder))
        print(f"compare: {variant} -> {folder}", flush=True)
        code = subprocess.call([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO)
        if code and not (folder / "report" / "summary.json").exists():
            raise SystemExit(f"compare: {variant} exited with status {code} and left no report")
        folders.append(folder)
    return folders


def main(argv=None) -> int:
    cli = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    cli.add_argument("folders", nargs="*", help="run folders (OUTPUT_DIR or OUTPUT_DIR/report)")
    cli.add_argument(
        "--run",
        nargs="?",
        const="",
        metavar="OUT",
        help="run every variant first, into OUT/<variant> (default $OUTPUT_DIR/compare)",
    )
    cli.add_argument("--plot", type=Path, help="where to write the loss curves (PNG)")
    args = cli.parse_args(argv)
    folders = args.folders
    if args.run is not None:
        out = Path(args.run or os.path.join(os.environ.get("OUTPUT_DIR", "./outputs"), "compare"))
        folders = run_variants(out) + folders
    if not folders:
        cli.error("give run folders to compare, or --run")
    compare(folders, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
