"""A stand-in Hugging Face Hub for the fetch tests: a `huggingface_hub` package first on a child's PYTHONPATH.

It answers `snapshot_download` as the real one is called (writing the files that match `allow_patterns`: the
tokenizer and config, and a sharded model of two safetensors behind an index) and `HfApi.model_info` (the shards'
sizes), prints the token where a careless library might, and logs every download to $FAKE_HUB_LOG. Knobs:
FAKE_HUB_FAIL (a 401 naming the token), FAKE_HUB_SKIP (a file whose name contains it is left out),
FAKE_HUB_SHARD_BYTES (the size model_info gives each shard). Also the launcher run in-process with the fetch child
real and the recipes' pre-launch pass and torchrun recorded (the stand-in would be their huggingface_hub too),
which both fetch test files drive.
"""

import json

from conftest import stand_in

from entrypoint import cli, launch, preflight

TOKEN = "hf_secret_do_not_print"
SOURCE = """
import fnmatch, json, os, sys, types

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

class HfApi:
    def model_info(self, repo_id, files_metadata=False):
        size = int(os.environ.get("FAKE_HUB_SHARD_BYTES", "1000"))
        return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=n, size=size) for n in SHARDS])

def snapshot_download(repo_id, local_dir, allow_patterns):
    token = os.environ.get("HF_TOKEN")
    print(f"fake hub: {repo_id} with token {token}", file=sys.stderr)
    sys.stderr.write(f"Fetching files: 100%|##########| [token={token}]\\r\\n")
    with open(os.environ["FAKE_HUB_LOG"], "a") as log:
        log.write(json.dumps([repo_id, local_dir, sorted(allow_patterns)]) + "\\n")
    if os.environ.get("FAKE_HUB_FAIL"):
        raise OSError(f"401 Client Error for url https://huggingface.co/{repo_id} (Authorization: Bearer {token})")
    files = {name: "{}" for name in ("config.json", "tokenizer.json", "tokenizer_config.json")}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {"a": SHARDS[0], "b": SHARDS[1]}})
    files.update({name: "" for name in SHARDS})
    skip = os.environ.get("FAKE_HUB_SKIP")
    os.makedirs(local_dir, exist_ok=True)
    for name, text in files.items():
        if any(fnmatch.fnmatch(name, p) for p in allow_patterns) and not (skip and skip in name):
            open(os.path.join(local_dir, name), "w").write(text)
    return local_dir
"""


def env(tmp_path) -> dict:
    """The environment in which a child process imports the stand-in, with the token set."""
    return stand_in(tmp_path, "huggingface_hub", SOURCE, FAKE_HUB_LOG=str(tmp_path / "hub.log"), HF_TOKEN=TOKEN)


def asked(tmp_path) -> list:
    """Each snapshot_download call: [repo, local_dir, allow_patterns]."""
    log = tmp_path / "hub.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def full_scale(hub, tmp_path, **extra) -> dict:
    return {
        **hub,
        "DEVICE": "cpu",
        "SCALE": "full",
        "ASSETS_DIR": str(tmp_path / "assets"),
        "CACHE_DIR": str(tmp_path / "cache"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        **extra,
    }


def run_launcher(monkeypatch, capsys, environ):
    """cli.main in this process: the fetch child runs for real; the pre-launch pass and torchrun are recorded."""
    monkeypatch.setattr(preflight, "recipes_pass", lambda *args, **kwargs: ([], {"lines": []}))
    real_run, launched = launch.run, []

    def run(argv, child_env, grace, peer=None):
        if "neuron_qwen3.hf.fetch" in argv:
            return real_run(argv, child_env, grace)
        launched.append(argv)
        return 0

    monkeypatch.setattr(launch, "run", run)
    monkeypatch.setattr(launch, "watch", lambda: None)  # leave pytest's own signal handlers alone
    code = cli.main([], environ)
    out, err = capsys.readouterr()
    return code, out, err, launched
