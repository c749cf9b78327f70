"""`python -m entrypoint.fetch_assets REPO DEST [--weights]`: a model's full-scale assets from the Hugging Face Hub.

A child of the launcher (which stays stdlib-only), run at full scale when DEST lacks what training reads and the Hub
may be asked: a resumable snapshot download of the tokenizer and config.json, and with `--weights` (INIT_FROM=hub)
the safetensors. huggingface_hub reads HF_TOKEN itself; everything printed has it replaced with ***. Exit status 0
when the files are there, 1 when the download failed (worth a retry), 2 on bad arguments or when the weights do not
fit on DEST's disk (their size asked of the Hub first).
"""

import fnmatch
import json
import os
import shutil
import sys

REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")
PATTERNS = (*REQUIRED, "generation_config.json", "vocab.json", "merges.txt")  # also fetched when the repo has them
WEIGHTS = ("*.safetensors", "model.safetensors.index.json")  # INIT_FROM=hub: the weights, sharded or not


def missing(dest, weights=False) -> list:
    """The required files not (yet) in `dest`; huggingface_hub writes each under a temporary name, then renames.
    With `weights`, also the safetensors (every shard the index names)."""
    absent = [name for name in REQUIRED if not os.path.isfile(os.path.join(dest, name))]
    if weights and not weights_present(dest):
        absent.append("*.safetensors")
    return absent


def weights_present(folder) -> bool:
    """Every shard model.safetensors.index.json names, else at least one *.safetensors."""
    try:
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            shards = set(json.load(f)["weight_map"].values())
    except FileNotFoundError:
        return os.path.isdir(folder) and any(name.endswith(".safetensors") for name in os.listdir(folder))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return all(os.path.isfile(os.path.join(folder, name)) for name in shards)


class Redacted:
    """A text stream that writes through to `stream` with `secret` replaced by ***."""

    def __init__(self, stream, secret):
        self._stream, self._secret = stream, secret

    def write(self, text):
        return self._stream.write(text.replace(self._secret, "***") if self._secret else text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding...: the wrapped stream's
        return getattr(self._stream, name)


def short_of_space(repo, dest) -> str | None:
    """Why the weights still to fetch do not fit on DEST's disk, as one line; None when they fit or the Hub does not
    say their size (the download then reports its own error)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().model_info(repo, files_metadata=True).siblings or []
    except Exception:
        return None
    needed = sum(f.size or 0 for f in files if any(fnmatch.fnmatch(f.rfilename, p) for p in WEIGHTS)
                 and not os.path.isfile(os.path.join(dest, f.rfilename)))  # a resumed download fetches the rest
    existing = os.path.abspath(dest)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if needed <= free:
        return None
    return (f"{repo}'s weights need {needed / 2**30:.1f} GiB more in {dest} but its disk has {free / 2**30:.1f} GiB "
            "free: free space there, or mount a larger volume at ASSETS_DIR")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    weights = "--weights" in argv
    argv = [arg for arg in argv if arg != "--weights"]
    if len(argv) != 2:
        print("usage: python -m entrypoint.fetch_assets HUB_REPO DEST [--weights]", file=sys.stderr)
        return 2
    repo, dest = argv
    extra = WEIGHTS if weights else ()
    token = os.environ.get("HF_TOKEN")
    # before huggingface_hub is imported: its loggers and progress bars capture sys.stderr when created
    sys.stdout, sys.stderr = Redacted(sys.stdout, token), Redacted(sys.stderr, token)
    print(f"entrypoint: fetching {repo} ({', '.join((*REQUIRED, *extra))}) into {dest}", flush=True)
    short = short_of_space(repo, dest) if weights else None
    if short:
        print(f"entrypoint: {short}", file=sys.stderr)
        return 2
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo, local_dir=dest, allow_patterns=[*PATTERNS, *extra])
    except Exception as error:  # network, authorisation, disk: one line, retryable status
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(f"entrypoint: could not fetch {repo} into {dest}: {type(error).__name__}: {first_line}; to go on, "
              f"fill it where the Hub is reachable (`hf download {repo} --include '*.json' 'tokenizer*'"
              f"{' *.safetensors' if weights else ''} --local-dir {dest}`) or mount a folder that has them at "
              "ASSETS_DIR", file=sys.stderr)
        return 1
    still = missing(dest, weights)
    if still:
        print(f"entrypoint: {repo} was fetched into {dest} but has no {', '.join(still)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
