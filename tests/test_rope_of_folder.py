"""The model that trains is the folder's: INIT_FROM's RoPE (config.json, either transformers form) on every variant.

Qwen3-4B-Instruct-2507, the article's model, has rope_theta 5,000,000; torchtitan's Qwen3 flavors build 1,000,000.
- in process: each variant's smoke config, finished with INIT_FROM a folder of theta 5,000,000, computes the
  folder's logits in transformers (and not those of theta 1,000,000, 20 % apart at 256 positions);
- a scaled RoPE (YaRN) is refused by the pre-launch pass in one line naming the field; MODEL's released RoPE
  serves a config finished without a folder;
- three launcher runs at learning rate 0 (native, v5, nki_moe): the export's config.json carries the folder's RoPE,
  and transformers serves the folder's logits from it.
Run: .venv/bin/python -m pytest tests/test_rope_of_folder.py -q
"""

import functools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import REPO, folder_tensors, recipes_pass, side_by_side_env
from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.finish import configure_rope, finish
from neuron_qwen3.hf import rope as hf_rope
from neuron_qwen3.prelaunch import preflight

THETA = 5_000_000.0
TOKENS = torch.randint(0, 2048, (2, 256), generator=torch.Generator().manual_seed(0))
VARIANTS = ("native", "v5", "nki_moe")


def hf_config(moe: bool, **rope) -> dict:
    """The smoke model's config.json as transformers takes it (dense: the v5 smoke config's; MoE: nki_moe's), its
    RoPE replaced by `rope`'s keys."""
    from neuron_qwen3.hf import weights

    if moe:
        config = config_registry.nki_moe_qwen3_smoke()
        config.checkpoint.initial_load_in_hf = True
        weights.hf_compatible(config)
        base = weights.native_hf_config(config.model_spec.model, {})
    else:
        base = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    kept = {k: v for k, v in base.items() if not rope or k not in ("rope_parameters", "rope_theta")}
    return {**kept, **rope}


def save(folder, moe: bool, **rope):
    """A random smoke-shaped Qwen3 (or Qwen3-MoE) saved by transformers with `rope`'s keys in its config.json."""
    import transformers

    kind = (
        (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM)
        if moe
        else (
            transformers.Qwen3Config,
            transformers.Qwen3ForCausalLM,
        )
    )
    torch.manual_seed(0)
    model = kind[1](kind[0](**hf_config(moe, **rope)))
    model.save_pretrained(folder)
    if rope.get("rope_theta"):  # transformers 5 saves rope_parameters: the folder as Qwen publishes it (4.x form)
        written = json.loads((folder / "config.json").read_text())
        written.pop("rope_parameters", None)
        (folder / "config.json").write_text(json.dumps({**written, **rope, "rope_scaling": None}))
    return model


def logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model(tokens).logits


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def finished(variant: str, folder, *flags):
    config, problem = preflight.parse_config(
        [
            "--module",
            "neuron_qwen3",
            "--config",
            f"{variant}_qwen3_smoke",
            "--checkpoint.enable",
            f"--checkpoint.initial_load_path={folder}",
            "--checkpoint.initial_load_in_hf",
            *flags,
        ],
        {},
    )
    assert problem is None, problem
    return config, finish(config, 1, "cpu")


def built(config):
    """The finished config's model with the folder's weights, as the trainer builds and loads it."""
    from torchtitan.config.override import apply_overrides

    from neuron_qwen3.quirks import hf_rope_fix

    hf_rope_fix.apply()  # as the v5 trainer does
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    with torch.device("meta"):
        model = model_config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)  # the RoPE buffers
    adapter = config.model_spec.state_dict_adapter(model_config, None)
    model.load_state_dict(adapter.from_hf(folder_tensors(config.checkpoint.initial_load_path)), strict=True)
    return model.eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_trained_function_is_the_folders(tmp_path, variant):
    """The training forward in float32 (nki_moe's experts too) against transformers on the folder."""
    moe = variant == "nki_moe"
    reference = save(tmp_path, moe, rope_theta=THETA)
    config, done = finished(variant, tmp_path, "--training.mixed_precision_param", "float32")
    assert "rope: theta 5,000,000, 4,096 positions, from INIT_FROM's config.json" in " ".join(done.lines)
    model = built(config)
    tokens = TOKENS[:, : config.training.seq_len]  # nki_moe's smoke window: 128
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        if variant == "v5":
            ours = model(tokens, positions=positions)
        else:
            ours = model(tokens, attention_masks=model.get_attention_masks(positions), positions=positions)
    assert rel_err(ours, logits(reference, tokens)) <= 1e-5
    reference.config.rope_parameters["rope_theta"] = 1_000_000.0  # the config's own RoPE: another function
    reference.model.rotary_emb.__init__(reference.config)
    assert rel_err(ours, logits(reference, tokens)) > 1e-2


@pytest.mark.parametrize(
    "rope, field",
    [
        (
            {
                "rope_theta": 1e6,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
            "rope_scaling",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 4.0,
                    "original_max_position_embeddings": 1024,
                }
            },
            "rope_parameters",
        ),
        ({"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ],
)
def test_a_scaled_rope_is_refused_before_launch_naming_the_field(tmp_path, rope, field):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(False, **rope)))
    kind = rope.get("rope_scaling") or rope.get("rope_parameters")
    kind = kind.get("rope_type", kind.get("type"))
    answer = recipes_pass(tmp_path, VARIANT="native", INIT_FROM=str(folder))
    assert answer["problems"] == [
        f"INIT_FROM={str(folder)!r}: config.json's {field} has rope_type={kind!r}, which this project does not "
        "train yet (allowed: rope_type 'default')"
    ]


@pytest.mark.parametrize("variant", ("native", "v5"))
def test_a_dpo_reference_of_another_rope_is_refused(tmp_path, variant):
    """The frozen reference is built as the policy is: its folder must have the policy's RoPE."""
    reference = tmp_path / "reference"
    save(tmp_path / "policy", False, rope_theta=THETA)
    save(reference, False, rope_theta=1e6)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Is 4 even?", "chosen": " Yes.", "rejected": " No."}) + "\n")
    env = dict(VARIANT=variant, INIT_FROM=str(tmp_path / "policy"), METHOD="dpo", DATASET=str(pairs), STEPS="1")
    assert recipes_pass(tmp_path, **env, DPO_REFERENCE=str(tmp_path / "policy"))["problems"] == []
    assert recipes_pass(tmp_path, **env, DPO_REFERENCE=str(reference))["problems"] == [
        f"DPO_REFERENCE={str(reference)!r} has rope_theta=1e+06 but the run trains rope_theta=5e+06"
    ]


def test_both_forms_of_config_json_read_as_transformers_reads_them(tmp_path):
    import transformers

    for name, rope in (
        ("four", {"rope_theta": 10_000.0, "rope_scaling": None}),
        ("five", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
        ("neither", {"max_position_embeddings": 512}),  # transformers' default theta
    ):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf_config(False, **rope)))
        served = transformers.AutoConfig.from_pretrained(folder)
        read = hf_rope.of_folder(str(folder), "INIT_FROM")
        assert read == hf_rope.Rope(served.rope_parameters["rope_theta"], served.max_position_embeddings)
    assert hf_rope.of_folder(str(tmp_path / "four"), "INIT_FROM").theta == 10_000.0
    assert hf_rope.of_folder(str(tmp_path / "neither"), "INIT_FROM").positions == 512
    assert hf_rope.of_folder(str(tmp_path / "nothing"), "INIT_FROM") is None


def test_a_folder_of_the_configs_own_rope_changes_nothing(tmp_path):
    save(tmp_path, False)  # the bundled smoke config.json: theta 1,000,000, 4,096 positions
    config, done = finished("native", tmp_path)
    assert not [line for line in done.lines if line.startswith("rope:")]
    assert {layer.attention.rope.theta for layer in config.model_spec.model.layers} == {1_000_000.0}


@pytest.mark.parametrize(
    "model, variant",
    [(m, "native") for m in ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B")]
    + [("Qwen/Qwen3-4B-Thinking-2507", "native"), ("Qwen/Qwen3-30B-A3B-Instruct-2507", "nki_moe")],
)
def test_a_released_form_without_a_folder_trains_its_own_rope(model, variant):
    config = getattr(config_registry, f"{variant}_qwen3_{shapes.flavor_name(shapes.MODELS[model])}")()
    config.report.model = model  # the launcher's --report.model
    config.hf_assets_path = "/nonexistent"  # before the assets are fetched
    line = configure_rope(config)
    theta, positions = shapes.RELEASED_ROPE.get(model, (1_000_000.0, 40_960))
    assert {
        (layer.attention.rope.theta, layer.attention.rope.max_seq_len) for layer in config.model_spec.model.layers
    } == {(theta, positions)}
    assert (line is None) == (model not in shapes.RELEASED_ROPE)


# ---- through the launcher: learning rate 0, the export served by transformers ------------------------------


@functools.cache
def runs(tmp):
    from pathlib import Path

    tmp = Path(tmp)
    for moe in (False, True):
        save(tmp / ("moe-source" if moe else "dense-source"), moe, rope_theta=THETA)

    def launch(variant):
        env = side_by_side_env(
            VARIANT=variant,
            SCALE="smoke",
            INIT_FROM=str(tmp / ("moe-source" if variant == "nki_moe" else "dense-source")),
            STEPS="1",
            EXTRA_ARGS="--tune.lr 0",
            OUTPUT_DIR=str(tmp / f"{variant}-out"),
            CACHE_DIR=str(tmp / "cache"),
            EXPORT_DIR=str(tmp / variant),
            EXPORT_DTYPE="float32",
        )
        return subprocess.run(
            [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )

    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        return tmp, dict(zip(VARIANTS, pool.map(launch, VARIANTS)))


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("rope")))


@pytest.mark.training
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_export_is_the_folders_model(launched, variant):
    """At learning rate 0 the weights stay: the export must serve exactly the folder's logits, in a fresh
    interpreter (in this one, the in-process tests above have patched transformers' rotary init)."""
    tmp, results = launched
    result = results[variant]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rope: theta 5,000,000, 4,096 positions, from INIT_FROM's config.json" in result.stdout + result.stderr
    source = tmp / ("moe-source" if variant == "nki_moe" else "dense-source")
    serve = (
        "import sys, torch, transformers\n"
        "tokens = torch.randint(0, 2048, (2, 256), generator=torch.Generator().manual_seed(0))\n"
        "served, source = (transformers.AutoModelForCausalLM.from_pretrained(p) for p in sys.argv[1:])\n"
        "print(served.config.rope_parameters['rope_theta'])\n"
        "with torch.no_grad():\n"
        "    print(((served(tokens).logits - source(tokens).logits).abs().max()).item())\n"
    )
    served = subprocess.run(
        [sys.executable, "-c", serve, str(tmp / variant), str(source)], capture_output=True, text=True, timeout=300
    )
    assert served.returncode == 0, served.stderr[-2000:]
    theta, difference = served.stdout.split()
    assert float(theta) == THETA
    assert float(difference) <= 1e-5
