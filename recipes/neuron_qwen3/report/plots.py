"""The report's plots (matplotlib, headless Agg): loss curves with their smoothing, throughput with the warm-up,
a MoE run's tokens per expert, a DPO run's rewards and preference accuracy.

Kept apart from run_report.py so the comparison tool draws the same plots without importing torch.
"""

import statistics
from pathlib import Path

PLOT_SIZE = (8, 4.5)  # inches, at PLOT_DPI: 800 x 450 pixels
PLOT_DPI = 100


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(title, ylabel):
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at step 1.5
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return plt, fig, ax


def smoothed(values: list, weight: float = 0.6) -> list:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first point is the first value."""
    out, average = [], 0.0
    for i, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def plot_loss(records: list, path: Path, label: str | None = None, validation: list = ()) -> None:
    plot_losses({label or "loss": records}, path, validation)


def plot_losses(runs: dict, path: Path, validation: list = ()) -> None:
    """One loss curve per run (raw, faint) with its smoothing (solid); the validation loss beside them."""
    plt, fig, ax = _figure("training and validation loss" if validation else "training loss", "loss")
    for label, records in runs.items():
        steps, losses = [r["step"] for r in records], [r["loss"] for r in records]
        (line,) = ax.plot(steps, smoothed(losses), label=f"{label} (smoothed)")
        ax.plot(steps, losses, color=line.get_color(), alpha=0.3, marker=".", label=f"{label} (raw)")
    if validation:
        ax.plot(
            [v["step"] for v in validation],
            [v["validation_loss"] for v in validation],
            color="black",
            marker="o",
            label="validation (whole set)",
        )
    ax.legend()
    fig.savefig(path)
    plt.close(fig)


def plot_throughput(records: list, warmup_steps: int, path: Path) -> None:
    plt, fig, ax = _figure("throughput (whole job)", "tokens/s")
    ax.plot([r["step"] for r in records], [r["tokens_per_s"] for r in records], marker=".")
    steady = [r["tokens_per_s"] for r in records if r["step"] > warmup_steps]
    if steady:
        ax.axhline(statistics.median(steady), color="gray", linestyle="--", label="steady-state median")
    if warmup_steps:
        ax.axvspan(
            records[0]["step"] - 0.5,
            warmup_steps + 0.5,
            color="orange",
            alpha=0.2,
            label=f"warm-up (steps 1-{warmup_steps}): not in the steady state",
        )
    ax.legend()
    fig.savefig(path)
    plt.close(fig)


def plot_experts(tokens: list, step: int, path: Path) -> None:
    """A heatmap of the tokens each expert got in each MoE layer (`tokens`: a list per layer) over the logging
    interval that ended at `step`: a router that sends most tokens to a few experts shows as a bright cell."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    image = ax.imshow(tokens, aspect="auto", interpolation="nearest", vmin=0)  # 0: a dark cell is an idle expert
    ax.set_title(f"tokens per expert, logging interval to step {step}")
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=ax, label="tokens routed (all ranks)")
    fig.savefig(path)
    plt.close(fig)


def plot_preference(records: list, path: Path, validation: list = ()) -> None:
    """METHOD=dpo: the rewards of the chosen and the rejected completions and their margin (left axis), the
    preference accuracy (right axis), per logged step; the held-out pairs' accuracy beside it."""
    plt, fig, ax = _figure("DPO rewards and preference accuracy", "reward (beta x log-ratio)")
    steps = [r["step"] for r in records]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        ax.plot(steps, [r["dpo"][key] for r in records], marker=".", label=key)
    right = ax.twinx()
    right.set_ylabel("preference accuracy")
    right.set_ylim(-0.05, 1.05)
    right.plot(
        steps,
        [r["dpo"]["rewards/accuracies"] for r in records],
        color="black",
        alpha=0.4,
        marker=".",
        label="accuracy (training pairs)",
    )
    if validation:
        right.plot(
            [v["step"] for v in validation],
            [v["dpo"]["rewards/accuracies"] for v in validation],
            color="black",
            marker="o",
            label="accuracy (held-out pairs)",
        )
    lines = [line for axis in (ax, right) for line in axis.get_lines()]
    ax.legend(lines, [line.get_label() for line in lines], loc="best")
    fig.savefig(path)
    plt.close(fig)
