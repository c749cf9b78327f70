"""INIT_FROM load and EXPORT_DIR export on CPU, beside a plain sequential read and write of the same bytes.

    PYTHONPATH=recipes .venv/bin/python -m bench.bench_weights                  # smoke and ~1B (needs ~8 GB RAM)
    PYTHONPATH=recipes .venv/bin/python -m bench.bench_weights --sizes smoke    # seconds

The load is torchtitan 0.3.0's HF initial load as `DCPCheckpointer.dcp_load(from_hf=True)` does it, on one
process: the model's state dict through the adapter's `to_hf`, `dcp.load` with the adapter's
HuggingFaceStorageReader, `from_hf`, `load_state_dict`. The export is `neuron_qwen3.weights.export` itself (gather,
`to_hf`, cast, safetensors + config.json, atomic rename). Each is timed beside a plain sequential read (64 MiB
reads) or write of the same bytes, alternating in one run, so load from other processes hits both alike; the page
cache is warm for both (nothing is dropped), so the reads measure memory and parsing, not the disk. Median of
--repeats; GB/s = bytes of safetensors / seconds.
"""

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
import types

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.components.checkpoint import ModelWrapper
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _build_qwen3_layers, _qwen3_norm, model_registry
from torchtitan.models.qwen3.model import Qwen3Model

from neuron_qwen3 import config_registry, weights

CHUNK = 64 << 20
# a dense Qwen3 of about 1.1 B parameters (Qwen3-1.7B's width and heads, 16 layers), tied embeddings as the small
# Qwen3s
ONE_B = dict(dim=2048, n_layers=16, n_heads=16, n_kv_heads=8, head_dim=128, hidden_dim=6144, vocab_size=151936)


def model_config(shape: dict) -> Qwen3Model.Config:
    s = shape
    return Qwen3Model.Config(
        vocab_size=s["vocab_size"], dim=s["dim"], norm=_qwen3_norm(s["dim"]), enable_weight_tying=True,
        tok_embeddings=Embedding.Config(num_embeddings=s["vocab_size"], embedding_dim=s["dim"],
                                        param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=s["dim"], out_features=s["vocab_size"], param_init=_LINEAR_INIT),
        layers=_build_qwen3_layers(n_layers=s["n_layers"], dim=s["dim"], n_heads=s["n_heads"],
                                   n_kv_heads=s["n_kv_heads"], head_dim=s["head_dim"], hidden_dim=s["hidden_dim"],
                                   attn_backend="flex",
                                   rope=CosSinRoPE.Config(dim=s["head_dim"], max_seq_len=4096, theta=1e6)))


def trainer_for(shape: dict, source: str | None) -> types.SimpleNamespace:
    """What weights.export reads of a Trainer: its config (model spec, checkpoint settings) and model parts."""
    config = config_registry.native_qwen3_smoke()
    config.model_spec = dataclasses.replace(model_registry("debugmodel"), model=model_config(shape))
    config.checkpoint.initial_load_path = source
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)  # as the trainer does after to_empty (it re-ties lm_head)
    return types.SimpleNamespace(config=config, model_parts=[model], model_config=config.model_spec.model)


def safetensors_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".safetensors"))


def plain_read(folder: str, buffer: bytearray) -> None:
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass


def plain_write(target: str, size: int, block: bytes) -> None:
    with open(target, "wb") as f:
        for offset in range(0, size, CHUNK):
            f.write(block[: min(CHUNK, size - offset)])


def hf_load(trainer, folder: str) -> None:
    """torchtitan's DCPCheckpointer.dcp_load(from_hf=True) on one process."""
    wrapper = ModelWrapper(trainer.model_parts)
    adapter = trainer.config.model_spec.state_dict_adapter(trainer.model_config, None)
    hf_state_dict = adapter.to_hf(wrapper.state_dict())
    dcp.load(hf_state_dict, storage_reader=adapter.get_hf_storage_reader(folder))
    wrapper.load_state_dict(adapter.from_hf(hf_state_dict))


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench(name: str, shape: dict, repeats: int, dtype: str, root: str) -> None:
    source = os.path.join(root, f"{name}-source")
    os.environ[weights.EXPORT_ENV] = source
    trainer = trainer_for(shape, None)
    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())
    trainer.config.checkpoint.export_dtype = dtype
    weights.export(trainer)  # the folder the loads read
    size = safetensors_bytes(source)
    loader = trainer_for(shape, source)
    loader.config.checkpoint.export_dtype = dtype
    buffer, block = bytearray(CHUNK), os.urandom(1 << 20) * (CHUNK >> 20)
    rows = {"plain read": [], "INIT_FROM load": [], "plain write": [], "EXPORT_DIR export": []}
    os.environ[weights.EXPORT_ENV] = os.path.join(root, f"{name}-export")
    for _ in range(repeats):
        rows["plain read"].append(timed(plain_read, source, buffer))
        rows["INIT_FROM load"].append(timed(hf_load, loader, source))
        rows["plain write"].append(timed(plain_write, os.path.join(root, "plain.bin"), size, block))
        os.remove(os.path.join(root, "plain.bin"))
        rows["EXPORT_DIR export"].append(timed(weights.export, loader))
    loaded, made = loader.model_parts[0].state_dict(), trainer.model_parts[0].state_dict()
    wrong = [k for k in made if not torch.equal(loaded[k].to(getattr(torch, dtype)), made[k].to(getattr(torch, dtype)))]
    assert not wrong, wrong
    print(f"{name}: {parameters / 1e9:.3f} B parameters, {size / 1e6:.1f} MB of {dtype} safetensors")
    for label, seconds in rows.items():
        median = statistics.median(seconds)
        print(f"  {label:<18} {median:8.3f} s  {size / median / 1e9:7.3f} GB/s  (best {min(seconds):.3f} s)")
    shutil.rmtree(source)
    shutil.rmtree(os.path.join(root, f"{name}-export"))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--sizes", nargs="+", default=["smoke", "1b"], choices=["smoke", "1b"])
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    cli.add_argument("--dir", default=None, help="where the safetensors go (default: a temporary folder)")
    args = cli.parse_args()
    shapes = {"smoke": config_registry.SMOKE, "1b": ONE_B}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for name in args.sizes:
            bench(name, shapes[name], args.repeats, args.dtype, root)


if __name__ == "__main__":
    main()
