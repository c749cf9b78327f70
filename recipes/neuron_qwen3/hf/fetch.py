"""`python -m neuron_qwen3.hf.fetch REPO DEST [--weights] [--offline] [--check]`: the full-scale model assets, for the
launcher.

The launcher (stdlib only) runs this child whenever the run trains from a Hub model's assets. It decides what DEST
lacks (the files training reads; with --weights, the safetensors too, every shard the index names), says so and
stops when it may not download (--offline), else fetches the missing files with a resumable snapshot download,
refused first when they do not fit on DEST's disk (their sizes asked of the Hub), and checks that they arrived.
huggingface_hub reads HF_TOKEN itself; everything printed has it replaced with ***. Exit status 0 when DEST has
everything, 1 when the download failed or left a file out (worth a retry), 2 when it cannot be done here (bad
arguments, offline, DEST not writable, too little disk); --check fetches nothing and exits 3 where it would.
"""

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile

ASSETS = ("config.json", "tokenizer.json", "tokenizer_config.json")  # what training reads from DEST
OPTIONAL_ASSETS = ("generation_config.json", "vocab.json", "merges.txt")  # fetched with them where the repo has them
WEIGHTS = ("*.safetensors", "model.safetensors.index.json")  # --weights (INIT_FROM=hub)


class Redacted:
    """A text stream that writes through to `stream` with `secret` replaced by ***."""

    def __init__(self, stream, secret):
        self._stream, self._secret = stream, secret

    def write(self, text):
        return self._stream.write(text.replace(self._secret, "***") if self._secret else text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding...: the wrapped stream's
        return getattr(self._stream, name)


def missing_shards(folder) -> list | None:
    """The files model.safetensors.index.json names that `folder` lacks, sorted; None when the index does not read
    (also the HF checkpoints' completeness, checkpoints.problem)."""
    try:
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            shards = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return sorted(name for name in shards if not os.path.isfile(os.path.join(folder, name)))


def weights_present(folder) -> bool:
    """Every shard model.safetensors.index.json names, else at least one *.safetensors."""
    if os.path.isfile(os.path.join(folder, "model.safetensors.index.json")):
        return missing_shards(folder) == []
    return os.path.isdir(folder) and any(name.endswith(".safetensors") for name in os.listdir(folder))


def missing(folder, weights=False) -> list:
    """The files training reads that `folder` lacks (huggingface_hub writes each under a temporary name, then
    renames); with `weights`, also the safetensors."""
    absent = [name for name in ASSETS if not os.path.isfile(os.path.join(folder, name))]
    return absent + (["*.safetensors"] if weights and not weights_present(folder) else [])


def nearest(path) -> str:
    """`path`, or the nearest folder above it that exists (a writer makes the rest; also preflight's export)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def unwritable(dest) -> str | None:
    """Why the download could not write into DEST, as one line; None when it can. Leaves nothing behind."""
    existing = nearest(dest)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, "a file is in the way")
        if existing != os.path.abspath(dest):
            return (
                None
                if os.access(existing, os.W_OK | os.X_OK)
                else f"{dest} (ASSETS_DIR) cannot be made: "
                f"{existing} is not writable; mount a writable volume at ASSETS_DIR"
            )
        tempfile.TemporaryFile(dir=dest).close()  # an unnamed file: a read-only mount refuses it, even to root
        return None
    except OSError as error:
        return (
            f"{dest} (ASSETS_DIR) is not writable: {error.strerror or type(error).__name__}; mount a writable "
            "volume at ASSETS_DIR"
        )


def short_of_space(repo, dest, patterns) -> str | None:
    """Why the files still to fetch do not fit on DEST's disk, as one line; None when they fit or the Hub does not
    say their size (the download then reports its own error)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().model_info(repo, files_metadata=True).siblings or []
    except Exception:
        return None
    needed = sum(
        f.size or 0
        for f in files
        if any(fnmatch.fnmatch(f.rfilename, p) for p in patterns)
        and not os.path.isfile(os.path.join(dest, f.rfilename))
    )  # a resumed download fetches the rest
    free = shutil.disk_usage(nearest(dest)).free
    if needed <= free:
        return None
    return (
        f"{repo}'s files need {needed / 2**30:.1f} GiB more in {dest} but its disk has {free / 2**30:.1f} GiB "
        "free: free space there, or mount a larger volume at ASSETS_DIR"
    )


def download(repo, dest, patterns) -> int:
    print(f"assets: fetching {repo} ({', '.join(patterns)}) into {dest}", flush=True)
    short = unwritable(dest) or short_of_space(repo, dest, patterns)
    if short:
        print(f"assets: {short}", file=sys.stderr)
        return 2
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo, local_dir=dest, allow_patterns=patterns)
    except Exception as error:  # network, authorisation, disk: one line, retryable status
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(
            f"assets: could not fetch {repo} into {dest}: {type(error).__name__}: {first_line}; to go on, "
            f"fill it where the Hub is reachable (`hf download {repo} --include "
            f"{' '.join(repr(p) for p in patterns)} --local-dir {dest}`) or mount a folder that has them at "
            "ASSETS_DIR",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv=None) -> int:
    cli = argparse.ArgumentParser(prog="python -m neuron_qwen3.hf.fetch")
    cli.add_argument("repo")
    cli.add_argument("dest")
    cli.add_argument("--weights", action="store_true", help="the safetensors too (INIT_FROM=hub)")
    cli.add_argument("--offline", action="store_true", help="never download (HF_HUB_OFFLINE=1)")
    cli.add_argument("--check", action="store_true", help="say what is missing; exit 3 where it would fetch")
    args = cli.parse_args(argv)
    token = os.environ.get("HF_TOKEN")  # a secret, so never a flag: argv shows in ps and in logs
    # before huggingface_hub is imported: its loggers and progress bars capture sys.stderr when created
    sys.stdout, sys.stderr = Redacted(sys.stdout, token), Redacted(sys.stderr, token)
    absent = missing(args.dest, args.weights)
    if not absent:
        if not args.check:
            print(f"assets: {args.dest} has {', '.join(ASSETS)}: not fetching", flush=True)
        return 0
    if args.offline:
        print(
            f"assets: {args.dest} has no {', '.join(absent)} and HF_HUB_OFFLINE=1 forbids downloading them: "
            f"fill ASSETS_DIR first (`hf download {args.repo} --local-dir {args.dest}`) or unset HF_HUB_OFFLINE",
            file=sys.stderr,
        )
        return 2
    if args.check:
        short = unwritable(args.dest)
        if short:
            print(f"assets: {short}", file=sys.stderr)
            return 2
        print(f"assets: {args.dest} has no {', '.join(absent)}: the launch fetches {args.repo}", flush=True)
        return 3
    code = download(args.repo, args.dest, [*ASSETS, *OPTIONAL_ASSETS, *(WEIGHTS if args.weights else ())])
    still = [] if code else missing(args.dest, args.weights)
    if still:
        print(f"assets: {args.repo} was fetched into {args.dest} but has no {', '.join(still)}", file=sys.stderr)
    return code or (1 if still else 0)


if __name__ == "__main__":
    sys.exit(main())
