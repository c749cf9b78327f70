"""`python -m neuron_qwen3.fetch REPO DEST PATTERN...`: files of a Hub model repo into DEST, for the launcher.

The launcher (stdlib only) decides what is missing and runs this child at full scale: a resumable snapshot
download of the files matching the patterns, refused first when they do not fit on DEST's disk (their sizes asked
of the Hub). huggingface_hub reads HF_TOKEN itself; everything printed has it replaced with ***. Exit status 0
when the download ended, 1 when it failed (worth a retry), 2 on bad arguments or too little disk.
"""

import fnmatch
import os
import shutil
import sys


class Redacted:
    """A text stream that writes through to `stream` with `secret` replaced by ***."""

    def __init__(self, stream, secret):
        self._stream, self._secret = stream, secret

    def write(self, text):
        return self._stream.write(text.replace(self._secret, "***") if self._secret else text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding...: the wrapped stream's
        return getattr(self._stream, name)


def short_of_space(repo, dest, patterns) -> str | None:
    """Why the files still to fetch do not fit on DEST's disk, as one line; None when they fit or the Hub does not
    say their size (the download then reports its own error)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().model_info(repo, files_metadata=True).siblings or []
    except Exception:
        return None
    needed = sum(f.size or 0 for f in files if any(fnmatch.fnmatch(f.rfilename, p) for p in patterns)
                 and not os.path.isfile(os.path.join(dest, f.rfilename)))  # a resumed download fetches the rest
    existing = os.path.abspath(dest)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if needed <= free:
        return None
    return (f"{repo}'s files need {needed / 2**30:.1f} GiB more in {dest} but its disk has {free / 2**30:.1f} GiB "
            "free: free space there, or mount a larger volume at ASSETS_DIR")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print("usage: python -m neuron_qwen3.fetch HUB_REPO DEST PATTERN...", file=sys.stderr)
        return 2
    repo, dest, *patterns = argv
    token = os.environ.get("HF_TOKEN")  # a secret, so never a flag: argv shows in ps and in logs
    # before huggingface_hub is imported: its loggers and progress bars capture sys.stderr when created
    sys.stdout, sys.stderr = Redacted(sys.stdout, token), Redacted(sys.stderr, token)
    print(f"entrypoint: fetching {repo} ({', '.join(patterns)}) into {dest}", flush=True)
    short = short_of_space(repo, dest, patterns)
    if short:
        print(f"entrypoint: {short}", file=sys.stderr)
        return 2
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo, local_dir=dest, allow_patterns=patterns)
    except Exception as error:  # network, authorisation, disk: one line, retryable status
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(f"entrypoint: could not fetch {repo} into {dest}: {type(error).__name__}: {first_line}; to go on, "
              f"fill it where the Hub is reachable (`hf download {repo} --include "
              f"{' '.join(repr(p) for p in patterns)} --local-dir {dest}`) or mount a folder that has them at "
              "ASSETS_DIR", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
