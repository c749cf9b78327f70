"""The token cache (neuron_qwen3/data/cache.py): its build on 1 process against every core, a hit against the
build, the pre-launch pass with EPOCHS on the cached set, and a worker's resident memory on 10x the records.

    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_token_cache                    # ~17 min on 2 cores
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_token_cache --records 5000 --build-repeats 1

Synthetic conversations of 7 messages (system, then 3 user/assistant pairs) of ~2,300 tokens with the bundled
smoke tokenizer, written to one .jsonl. First runs alternate 1 process and every core this process may run on,
each into an empty cache folder; then hits of the last, `python -m entrypoint --check` with EPOCHS=1 (the smoke
config's seq_len 256, where every record is longer and is fit from its cached tokens, and seq_len 4096, where
none is; and the bundled corpus without EPOCHS, the floor), and loaders in fresh interpreters reading rank 0's
share of 8 ranks, of a tenth of the records and of all of them (VmRSS, VmHWM).
Times are wall seconds: medians, with the range over repeats.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "recipes", "neuron_qwen3", "assets", "tokenizer")
WORDS = np.array(
    (
        "the model reads each token and the kernel moves data between the cores while the compiler plans "
        "every tensor so training stays fast on a large cluster of chips with careful memory use and a "
        "router that sends tokens to experts in sparse dense layers quiet bright patient garden river "
        "city"
    ).split()
)
ROLES = ["system"] + ["user", "assistant"] * 3
WORDS_PER_MESSAGE = ((25, 48), (64, 128), (160, 320), (64, 128), (160, 320), (64, 128), (160, 320))  # ~2,300 tokens
WORLD, SEQ_LEN = 8, 4096  # the loaders' ranks and window


def write(path: str, count: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    low, high = np.array(WORDS_PER_MESSAGE).T
    with open(path, "w") as f:
        for _ in range(count):
            sizes = rng.integers(low, high)
            words = np.split(WORDS[rng.integers(0, len(WORDS), sizes.sum())], np.cumsum(sizes)[:-1])
            f.write(
                json.dumps({"messages": [{"role": r, "content": " ".join(w)} for r, w in zip(ROLES, words)]}) + "\n"
            )


def head(source: str, path: str, count: int) -> str:
    with open(source) as f, open(path, "w") as out:
        out.writelines(line for _, line in zip(range(count), f))
    return path


def prepare(cache_dir: str, source: str, processes: int = 0):
    from neuron_qwen3.data import cache

    start = time.perf_counter()
    tokens = cache.prepare(cache_dir, source, "messages", "assistant", TOKENIZER, processes)
    return time.perf_counter() - start, tokens


def spread(values: list) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def builds(tmp: str, source: str, count: int, repeats: int, cores: int) -> tuple:
    """First runs on 1 process and on every core, alternating, each into an empty folder; the last all-core one
    stays in tmp/launch/tokens (CACHE_DIR/tokens of the --check runs). Returns (1-process s a record, all-core
    first-run times)."""
    times, cpu = {1: [], cores: []}, {1: [], cores: []}
    for _ in range(repeats):
        for processes in (1, cores):
            folder = os.path.join(tmp, "launch", "tokens") if processes == cores else os.path.join(tmp, "one")
            shutil.rmtree(folder, ignore_errors=True)
            before = os.times()
            seconds, tokens = prepare(folder, source, processes)
            after = os.times()
            assert not tokens.hit and len(tokens.writers) == processes, tokens.writers
            times[processes].append(seconds)
            cpu[processes].append(sum(after[:4]) - sum(before[:4]))  # this process's and its reaped children's
    shutil.rmtree(os.path.join(tmp, "one"))
    ratios = [one / many for one, many in zip(times[1], times[cores])]
    speedup = statistics.median(times[1]) / statistics.median(times[cores])
    print(
        f"first run, {count:,} records: 1 process {spread(times[1])}; {cores} processes {spread(times[cores])}: "
        f"{speedup:.2f}x (each pair {min(ratios):.2f}-{max(ratios):.2f}x; goal >= 1.8x on 2); CPU seconds, "
        f"1 process {statistics.median(cpu[1]):.0f}, {cores} processes {statistics.median(cpu[cores]):.0f}"
    )
    return statistics.median(times[1]) / count, times[cores]


def hits(folder: str, source: str, first: list, repeats: int) -> None:
    warm = [prepare(folder, source)[0] for _ in range(repeats)]
    assert prepare(folder, source)[1].hit
    os.rename(os.path.join(folder, "hashes.json"), os.path.join(folder, "hashes.json.aside"))
    cold = prepare(folder, source)[0]  # the content hashes read again: what the memo saves
    print(
        f"second run (a hit): {spread(warm)} = {statistics.median(warm) / statistics.median(first):.3%} of the "
        f"first run on every core (goal <= 2 %); without hashes.json (every file hashed again) {cold:.2f} s"
    )


def check(tmp: str, source: str | None, repeats: int, seq_len: int | None = None) -> None:
    """`python -m entrypoint --check` with EPOCHS=1 on `source`; None: the bundled corpus, no EPOCHS (the floor)."""
    data = dict(DATASET=source, DATASET_FIELD="messages", EPOCHS="1") if source else {}
    env = dict(
        os.environ,
        SCALE="smoke",
        CACHE_DIR=os.path.join(tmp, "launch"),
        OUTPUT_DIR=os.path.join(tmp, "out"),
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "recipes"), REPO]),
        EXTRA_ARGS=f"--training.seq_len {seq_len}" if seq_len else "",
        **data,
    )
    times = []
    for _ in range(repeats):  # the cache under CACHE_DIR/tokens is built (hits)
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "--check"], env=env, cwd=REPO, capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    if not source:
        print(
            f"--check, the bundled corpus, no EPOCHS (the launcher's and the pre-launch pass's own time): "
            f"{spread(times)}"
        )
        return
    steps = next(line for line in (result.stdout + result.stderr).splitlines() if "epochs = " in line).strip()
    print(
        f"--check, EPOCHS=1, seq_len {seq_len or '256 (smoke)'}, the cache built: {spread(times)} (goal <= 10 s); "
        f"{steps}"
    )


def parts(tmp: str, source: str) -> None:
    """Where a cached --check's time goes: EPOCHS' plan and the pre-launch pass's format scan (data.scan)."""
    from neuron_qwen3 import config_registry
    from neuron_qwen3.data import DataLoader, epochs, scan

    for seq_len in (256, SEQ_LEN):
        config = config_registry.native_qwen3_smoke()
        config.dataloader = DataLoader.Config(
            source=source, field="messages", epochs=1, cache_dir=os.path.join(tmp, "launch", "tokens")
        )
        config.training.seq_len = seq_len
        start = time.perf_counter()
        epochs.plan(config, 1)
        print(f"  EPOCHS' plan from the cache, seq_len {seq_len}: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    scan(source, "messages")
    print(f"  the pre-launch pass's format scan of every record (data.scan): {time.perf_counter() - start:.2f} s")


def memory(cache_dir: str, source: str) -> dict:
    """In a fresh interpreter: rank 0 of WORLD's loader over `source` iterating its whole share."""
    script = (
        f"import sys; sys.argv = ['', {cache_dir!r}, {source!r}]; "
        "from bench.bench_token_cache import rss_child; rss_child()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "recipes"), REPO])),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def status_mb(name: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name + ":")) / 1024


def rss_child() -> None:
    import torch
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import data

    torch.set_num_threads(1)
    cache_dir, source = sys.argv[1:3]
    start = status_mb("VmRSS")
    loader = data.DataLoader.Config(source=source, field="messages", cache_dir=cache_dir, infinite=False).build(
        dp_world_size=WORLD,
        dp_rank=0,
        tokenizer=HuggingFaceTokenizer(tokenizer_path=TOKENIZER),
        seq_len=SEQ_LEN,
        local_batch_size=1,
    )
    opened, began = status_mb("VmRSS"), time.perf_counter()
    windows = sum(1 for _ in loader.dataset)
    print(
        json.dumps(
            {
                "start": start,
                "opened": opened,
                "end": status_mb("VmRSS"),
                "hwm": status_mb("VmHWM"),
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "windows": windows,
                "records": loader.stats()["records"],
                "seconds": time.perf_counter() - began,
                "hit": (loader.stats()["cache"] or {}).get("hit"),
            }
        )
    )


def memories(cache_dir: str, source: str, count: int) -> None:
    small = head(source, os.path.join(os.path.dirname(source), "tenth.jsonl"), count // 10)
    prepare(cache_dir, small)  # built before: the loaders below hit
    print(f"a worker's memory: rank 0 of {WORLD} reading its whole share, seq_len {SEQ_LEN}, a fresh interpreter:")
    for name, path, folder in (
        (f"{count // 10:,} records, uncached", small, ""),
        (f"{count // 10:,} records", small, cache_dir),
        (f"{count:,} records", source, cache_dir),
    ):
        m = memory(folder, path)
        print(
            f"  {name}: {m['records']:,} read, {m['windows']:,} windows in {m['seconds']:.1f} s; VmRSS "
            f"{m['start']:.0f} MB before the loader, {m['opened']:.0f} MB opened, {m['end']:.0f} MB at the end "
            f"(+{m['end'] - m['start']:.0f} MB); peak {m['hwm']:.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--build-repeats", type=int, default=2, help="pairs of first runs (1 process, every core)")
    parser.add_argument("--repeats", type=int, default=3, help="hits and --check runs")
    parser.add_argument("--builds-only", action="store_true", help="the first runs alone")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "chat.jsonl")
        start = time.perf_counter()
        write(source, args.records)
        print(
            f"{args.records:,} conversations, {os.path.getsize(source) / 1e6:,.0f} MB, written in "
            f"{time.perf_counter() - start:.0f} s; {cores} cores; load average {os.getloadavg()[0]:.1f}"
        )
        per_record, first = builds(tmp, source, args.records, args.build_repeats, cores)
        if args.builds_only:
            return
        cache_dir = os.path.join(tmp, "launch", "tokens")
        hits(cache_dir, source, first, args.repeats)
        tokens = prepare(cache_dir, source)[1]
        lengths = tokens.index["length"]
        print(
            f"  1 process: {per_record * 1e3:.2f} ms a record; {lengths.mean():,.0f} tokens a record "
            f"({lengths.min():,}-{lengths.max():,}); the cache: "
            f"{sum(e.stat().st_size for e in os.scandir(tokens.folder)) / 1e6:,.0f} MB in "
            f"{len(os.listdir(tokens.folder))} files"
        )
        check(tmp, None, args.repeats)
        for seq_len in (None, SEQ_LEN):
            check(tmp, source, args.repeats, seq_len)
        parts(tmp, source)
        memories(cache_dir, source, args.records)
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
