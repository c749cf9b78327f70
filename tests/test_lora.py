"""LoRA without training: bad values stop the launch in one line (exit 2), and the adapters in the model are what
PEFT has, in names, layouts and function.

- the launcher, as a user runs it: rank 0, a bad alpha or dropout, a target the variant's model lacks, LoRA on a
  random init, TP, an adapter folder whose base cannot be found: one line, exit 2, nothing started (the recipes'
  pre-launch pass finds all but the first);
- the `--lora` section and an adapter folder as the initial load (its base loaded, its settings kept, others
  refused); the pre-launch pass does not let a checkpoint skip the base, and --dry-run states the footprint;
- the models the recipes build (smoke configs, in process): the adapters change nothing while B = 0, only they
  are trainable, and every default target maps to a module on every variant; the worker's own check for a target
  no module matches; PEFT's init;
- PEFT itself (peft 0.21.2 on transformers' Qwen3 and Qwen3-MoE of the smoke shapes): our adapter file's key
  names and shapes are exactly the ones PEFT writes, and our layout conversion round-trips;
- torch.compile (fullgraph, aot_eager) of each adapted module, forward and backward, as eager;
- the base fingerprint tells apart two bases of one shape; the footprint's arithmetic.
Run: flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m pytest tests/test_lora.py -q
"""

import json

import pytest
import torch

from conftest import launcher_errors, recipes_pass

from neuron_qwen3.lora import adapters, footprint, targets
from neuron_qwen3.lora.targets import TARGETS
from neuron_qwen3.settings import Lora


@pytest.fixture(scope="module")
def dense_base(tmp_path_factory):
    """A random Qwen3ForCausalLM of the dense smoke shape, saved by transformers."""
    import transformers

    from neuron_qwen3.config_registry import HF_MODEL

    folder = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    config = json.loads((HF_MODEL["smoke"] / "config.json").read_text())
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def moe_stub(tmp_path_factory):
    """What the pre-launch check reads of an MoE model folder: config.json and a safetensors header."""
    folder = tmp_path_factory.mktemp("moe")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    return folder


# ---- the launcher: one line, exit 2 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, says",
    [
        ({"LORA_RANK": "0"}, "LORA_RANK='0' is not a positive integer"),
        ({"LORA_RANK": "4", "LORA_ALPHA": "-2"}, "LORA_ALPHA='-2' is not a positive number"),
        ({"LORA_RANK": "4", "LORA_DROPOUT": "1"}, "LORA_DROPOUT='1' is not a number from 0 to below 1"),
        ({"LORA_RANK": "4"}, "LORA_RANK is set but INIT_FROM is not: LoRA trains adapters over a model's weights"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(tmp_path, env, says):
    status, lines = launcher_errors(tmp_path, timeout=120, **env)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"entrypoint: {says}"), lines


# The same pass, in process: each problem is its one line (the launcher prints it and exits 2, as above).
@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"LORA_RANK": "4", "LORA_TARGETS": "q_proj,wq", "INIT_FROM": "{base}"},
            "LORA_TARGETS: wq matches no module of a Qwen3 of the dense family (its targets: q_proj,",
        ),
        (
            {"LORA_RANK": "4", "LORA_TARGETS": "experts.down_proj", "INIT_FROM": "{base}"},
            "LORA_TARGETS: experts.down_proj matches no module of a Qwen3 of the dense family (its targets: q_proj,",
        ),
        (
            {"VARIANT": "nki_moe", "LORA_RANK": "4", "LORA_TARGETS": "q_proj,gate_proj", "INIT_FROM": "{moe}"},
            "LORA_TARGETS: gate_proj matches no module of a Qwen3 of the MoE family",
        ),
        (
            {
                "VARIANT": "nki_moe",
                "LORA_RANK": "4",
                "LORA_DROPOUT": "0.1",
                "LORA_TARGETS": "experts.down_proj",
                "INIT_FROM": "{moe}",
            },
            "LORA_DROPOUT=0.1 with expert targets: PEFT's LoRA on expert parameters has no dropout",
        ),
        (
            {"LORA_RANK": "4", "INIT_FROM": "{base}", "EXTRA_ARGS": "--parallelism.tensor_parallel_degree 2"},
            "LoRA here shards with FSDP only; this run has tensor parallelism degree 2",
        ),
    ],
)
def test_the_pre_launch_pass_names_each_bad_setting_in_one_line(tmp_path, dense_base, moe_stub, env, says):
    answer = recipes_pass(tmp_path, **{k: v.format(base=dense_base, moe=moe_stub) for k, v in env.items()})
    assert len(answer["problems"]) == 1 and answer["problems"][0].startswith(says), answer["problems"]


def test_an_adapter_whose_base_is_nowhere_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 4,
                "lora_alpha": 8,
                "target_modules": ["q_proj"],
                "base_model_name_or_path": "/gone/base",
            }
        )
    )
    status, lines = launcher_errors(tmp_path, timeout=120, INIT_FROM=str(tmp_path / "adapter"))
    assert status == 2 and len(lines) == 1, lines
    assert "its base model '/gone/base' is not a folder here" in lines[0]


def parsed(*flags, config="native_qwen3_smoke"):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--module", "neuron_qwen3", "--config", config, *flags])


def test_an_adapter_folder_names_its_base_and_becomes_the_initial_load(tmp_path, dense_base):
    from neuron_qwen3.lora import folders

    adapter, assets = tmp_path / "adapter", tmp_path / "assets"
    adapter.mkdir()
    (assets / "Qwen3-8B").mkdir(parents=True)
    for name, expected in (
        (str(dense_base), dense_base),
        ("../base", tmp_path / "base"),
        ("Qwen/Qwen3-8B", assets / "Qwen3-8B"),
    ):
        (tmp_path / "base").mkdir(exist_ok=True)
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": name}))
        assert folders.adapter_base(str(adapter), str(assets / "Qwen3-4B")) == str(expected)
    assert not folders.is_adapter_folder(str(dense_base))  # a model folder is no adapter folder
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 4,
                "lora_alpha": 16,
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": str(dense_base),
            }
        )
    )
    config = parsed(
        f"--checkpoint.initial_load_path={adapter}", "--checkpoint.initial_load_in_hf", "--export.merged=True"
    )
    assert folders.resolve(config) == Lora(rank=4, alpha=16.0, targets="q_proj,v_proj", adapter=str(adapter))
    assert config.lora.names == ("q_proj", "v_proj") and config.export.merged
    assert config.checkpoint.initial_load_path == str(dense_base)


@pytest.mark.parametrize("lora_flags, ignored", [((), True), (("--lora.rank=4",), False)])
def test_resuming_with_lora_does_not_ignore_init_from(tmp_path, dense_base, monkeypatch, lora_flags, ignored):
    """A complete checkpoint wins over INIT_FROM, except with LoRA: its base loads on every start, and the
    checkpoint's fingerprint is checked against it before launch."""
    from neuron_qwen3.lora import base_check
    from neuron_qwen3.prelaunch import checkpoints, preflight

    folder = tmp_path / "checkpoint"
    monkeypatch.setattr(checkpoints, "prepare", lambda *_, **__: (3, []))  # a step to resume
    asked = []
    monkeypatch.setattr(base_check, "check_resume_base", lambda step, base: asked.append((step, base)) or [])
    args = [
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_smoke",
        "--checkpoint.enable",
        f"--checkpoint.folder={folder}",
        f"--checkpoint.initial_load_path={dense_base}",
        "--checkpoint.initial_load_in_hf",
        *lora_flags,
    ]
    answer = preflight.run({"args": args, "ranks": 1, "check_files": True, "node_rank": 0})
    assert answer["problems"] == []
    assert any("INIT_FROM is ignored" in line for line in answer["warnings"]) == ignored, answer
    assert asked == ([] if ignored else [(f"{folder}/step-3", str(dense_base))])


def test_the_dry_run_states_trainable_frozen_and_memory(dense_base):
    from neuron_qwen3.prelaunch import preflight

    args = [
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_smoke",
        "--lora.rank=4",
        f"--checkpoint.initial_load_path={dense_base}",
        "--checkpoint.initial_load_in_hf",
    ]
    answer = preflight.run({"args": args, "ranks": 2, "print_config": True})
    line = answer["model"]["lora"]
    assert (
        line.startswith("19,456 trainable (2.880%), 656,128 frozen parameters; per rank over 2: ")
        and "full fine-tuning:" in line
    ), line
    assert answer["config"]["lora"]["rank"] == 4


# ---- the models the recipes build ----------------------------------------------------------------------------

SMOKE = {"native": "native_qwen3_smoke", "nki_moe": "nki_moe_qwen3_smoke", "v5": "v5_qwen3_smoke"}
FAMILY = {"native": "dense", "nki_moe": "moe", "v5": "dense"}


def built(variant, device="cpu"):
    """(config, model) of the variant's smoke config, as the trainer builds it (overrides applied), initialised."""
    from torchtitan.config.override import apply_overrides

    from neuron_qwen3 import config_registry

    config = getattr(config_registry, SMOKE[variant])()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_config.build()
    if device != "meta":
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
    return config, model


def logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    masks = {} if hasattr(model, "model") else {"attention_masks": model.get_attention_masks(positions)}
    return model(tokens, positions=positions, **masks)


@pytest.mark.parametrize("variant", SMOKE)
def test_every_target_maps_to_a_module(variant):
    _, model = built(variant, "meta")
    family = FAMILY[variant]
    sites = adapters.insert(model, Lora(rank=2, targets=",".join(TARGETS[family])), family)
    layers = 2
    assert len(sites) == layers * len(TARGETS[family])
    assert {s.hf_module.split(".", 3)[3] + (f".{s.hf_param}" if s.hf_param else "") for s in sites} == {
        f"{'self_attn' if t[0] in 'qkvo' else 'mlp'}.{t}" for t in TARGETS[family]
    }
    assert all(p.device.type == "meta" for p in model.parameters())  # built where the base is: nothing allocated


@pytest.fixture
def dense_attention(monkeypatch):
    """flex_attention has no CPU backward: the CPU adapter's dense stand-in, for this test only (the adapter as a
    whole must precede torchtitan.trainer's import, which other tests here have done)."""
    import torchtitan.experiments.transformers_modeling_backend.model as hf_backend
    import torchtitan.models.common.attention as attention

    from neuron_qwen3.quirks import cpu_adapter

    monkeypatch.setattr(attention.FlexAttention, "compiled_flex_attn", staticmethod(cpu_adapter._native_flex_attention))
    monkeypatch.setattr(hf_backend, "flex_attention_forward", cpu_adapter._hf_flex_attention_forward)


@pytest.mark.parametrize("variant", SMOKE)
def test_b_zero_changes_nothing_and_only_adapters_train(variant, dense_attention):
    _, model = built(variant)
    family = FAMILY[variant]
    tokens = torch.randint(0, 2048, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = logits(model, tokens)
    adapters.insert(model, Lora(rank=4, targets=",".join(TARGETS[family])), family)
    # FSDP reads each parameter back by its name (getattr); a name that gave a merged tensor made it the base
    assert all(model.get_parameter(name) is p for name, p in model.named_parameters())
    adapters.freeze_base(model)
    for adapter in adapters.adapters(model):
        adapter.reset_parameters()
        bound = 1 / adapter.fan_in**0.5  # PEFT: kaiming_uniform_(a=sqrt(5)) over (rank x in)
        assert adapter.lora_A.abs().max() <= bound and adapter.lora_A.std() > bound / 3
        assert not adapter.lora_B.any()
    with torch.no_grad():
        assert torch.equal(logits(model, tokens), before)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(adapters.is_adapter_key(name) for name in trainable)
    for adapter in adapters.adapters(model):
        torch.nn.init.normal_(adapter.lora_B, std=0.02)
    logits(model, tokens).float().square().mean().backward()
    assert {name for name, p in model.named_parameters() if p.grad is not None} == trainable


def test_a_target_no_module_matches_is_one_line_in_the_worker():
    _, model = built("nki_moe", "meta")  # an MoE model, told it is dense: the family check passes, the model has none
    with pytest.raises(targets.LoRAError) as caught:
        adapters.insert(model, Lora(rank=2, targets="q_proj,gate_proj"), "dense")
    assert str(caught.value).startswith("LORA_TARGETS: gate_proj matches no module of this model") and "\n" not in str(
        caught.value
    )


def test_lora_refuses_tensor_and_expert_parallelism():
    from types import SimpleNamespace

    dims = SimpleNamespace(tp_enabled=True, ep_enabled=False, pp_enabled=False, tp=2, ep=1, pp=1)
    parallelize = adapters.wrap_parallelize(lambda model, **_: model, Lora(rank=2), "dense")
    with pytest.raises(targets.LoRAError, match="FSDP only; this run has tp=2, ep=1, pp=1"):
        parallelize(torch.nn.Linear(2, 2), parallel_dims=dims)


def test_the_lora_section_is_the_settings():
    from neuron_qwen3.lora import folders

    assert folders.settings(parsed()) is None
    config = parsed("--lora.rank=8", "--lora.targets=q_proj,v_proj", "--export.merged=True")
    settings = folders.settings(config)
    assert settings is config.lora and settings.names == ("q_proj", "v_proj") and settings.scale == 2
    assert config.export.merged
    assert Lora(rank=8, alpha=4).scale == 0.5


# ---- PEFT's names and layouts ----------------------------------------------------------------------------------


def peft_model(variant, targets):
    """transformers' model of the variant's smoke shape with PEFT's LoRA on `targets`; (model, config)."""
    import peft
    import transformers

    from neuron_qwen3.hf import weights

    config, titan = built(variant, "meta")
    if variant == "nki_moe":
        hf = transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**weights.native_hf_config(config.model_spec.model, {}))
        )
    else:
        from neuron_qwen3.config_registry import HF_MODEL

        hf = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**json.loads((HF_MODEL["smoke"] / "config.json").read_text()))
        )
    modules = [t for t in targets if not t.startswith("experts.")]
    parameters = [t.replace("experts.", "mlp.experts.") for t in targets if t.startswith("experts.")]
    return peft.get_peft_model(
        hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=modules, target_parameters=parameters or None)
    ), titan


@pytest.mark.parametrize(
    "variant, targets",
    [
        ("native", TARGETS["dense"]),
        ("v5", TARGETS["dense"]),
        ("nki_moe", TARGETS["moe"]),
        ("nki_moe", ("k_proj", "experts.down_proj")),
        ("nki_moe", ("experts.gate_up_proj",)),
    ],
)
def test_the_adapter_file_has_peft_names_and_shapes(variant, targets):
    from safetensors.torch import load_file

    from neuron_qwen3.lora import folders

    reference, titan = peft_model(variant, targets)
    family = FAMILY[variant]
    sites = adapters.insert(titan, Lora(rank=4, targets=",".join(targets)), family)
    ours = {key: value.shape for key, value in titan.state_dict().items() if adapters.is_adapter_key(key)}
    torch.manual_seed(1)
    tensors = {key: torch.randn(shape) for key, shape in ours.items()}
    exported = folders.to_peft(sites, tensors)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        theirs = load_file(f"{folder}/adapter_model.safetensors")
    assert {k: tuple(v.shape) for k, v in exported.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    back = folders.from_peft(sites, exported, ours)
    assert all(torch.equal(back[key], tensors[key]) for key in tensors)


def test_expert_layout_is_the_one_peft_computes_with():
    """Per expert, PEFT's ParamWrapper delta from our exported A/B equals B_e A_e of our [E, ...] layout."""
    from neuron_qwen3.lora import folders

    reference, titan = peft_model("nki_moe", ("experts.gate_up_proj", "experts.down_proj"))
    sites = adapters.insert(titan, Lora(rank=4, alpha=8, targets="experts.gate_up_proj,experts.down_proj"), "moe")
    torch.manual_seed(2)
    ours = {k: torch.randn(v.shape) for k, v in titan.state_dict().items() if adapters.is_adapter_key(k)}
    reference.load_state_dict(
        {k.replace(".weight", ".default.weight"): v for k, v in folders.to_peft(sites, ours).items()}, strict=False
    )
    experts = reference.base_model.model.model.layers[0].mlp.experts
    for wrapper, site in ((experts.base_layer, sites[0]), (experts, sites[1])):
        a, b = ours[f"{site.key}.lora_A"], ours[f"{site.key}.lora_B"]
        expected = torch.bmm(b, a) * 2.0
        assert torch.allclose(wrapper.get_delta_weight("default"), expected, rtol=1e-5, atol=1e-6)
        assert torch.allclose(folders.delta(site, a, b, 2.0), expected, rtol=1e-5, atol=1e-6)


# ---- torch.compile -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["native", "nki_moe"])
def test_adapted_modules_compile_fullgraph(variant):
    _, model = built(variant)
    family = FAMILY[variant]
    adapters.insert(model, Lora(rank=4, targets=",".join(TARGETS[family])), family)
    # FSDP reads each parameter back by its name (getattr); a name that gave a merged tensor made it the base
    assert all(model.get_parameter(name) is p for name, p in model.named_parameters())
    adapters.freeze_base(model)
    for adapter in adapters.adapters(model):
        adapter.reset_parameters()
        torch.nn.init.normal_(adapter.lora_B, std=0.02)
    block = model.layers["0"]
    dim = block.attention.wo.out_features
    adapted = {
        "qkv": (block.attention.qkv_linear, (torch.randn(2, 16, dim),)),
        "o": (block.attention.wo, (torch.randn(2, 16, block.attention.wo.in_features),)),
    }
    if family == "moe":  # 32 routed rows, 8 per expert, as the dispatcher hands them over
        adapted["experts"] = (block.moe.routed_experts.inner_experts, (torch.randn(32, dim), torch.tensor([8] * 4)))
    else:
        adapted["down"] = (block.feed_forward.w2, (torch.randn(2, 16, block.feed_forward.w2.in_features),))
    for module, args in adapted.values():
        eager = module(*args)
        torch._dynamo.reset()
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)(*args)
        outs = (eager,) if isinstance(eager, torch.Tensor) else eager
        couts = (compiled,) if isinstance(compiled, torch.Tensor) else compiled
        for e, c in zip(outs, couts):
            assert torch.allclose(e, c, rtol=1e-5, atol=1e-6)
        sum(c.float().square().sum() for c in couts).backward()
        assert all(p.grad is not None for p in module.parameters() if p.requires_grad)
        assert all(p.grad is None for p in module.parameters() if not p.requires_grad)


# ---- the base's fingerprint; the footprint ---------------------------------------------------------------------


def test_the_fingerprint_tells_apart_two_bases_of_one_shape(tmp_path, dense_base):
    import shutil

    import transformers

    from neuron_qwen3.lora import base_check

    other = tmp_path / "other"
    torch.manual_seed(1)
    transformers.Qwen3ForCausalLM(transformers.AutoConfig.from_pretrained(dense_base)).save_pretrained(other)
    same = tmp_path / "same"
    shutil.copytree(dense_base, same)
    assert base_check.base_fingerprint(str(dense_base)) == base_check.base_fingerprint(str(same))
    assert base_check.base_fingerprint(str(dense_base))["bytes"] == base_check.base_fingerprint(str(other))[
        "bytes"
    ] and base_check.base_fingerprint(str(dense_base)) != base_check.base_fingerprint(str(other))
    check = base_check.BaseCheck(str(other))
    with pytest.raises(
        targets.LoRAError, match=r"trained over a base of [\d,]+ bytes \(sha256 \w{12}\), but INIT_FROM"
    ):
        check.load_state_dict(base_check.base_fingerprint(str(dense_base)))
    check.load_state_dict(base_check.base_fingerprint(str(other)))


def test_the_dry_run_footprint_shrinks_gradients_and_optimizer_with_the_trainable_share():
    from neuron_qwen3 import config_registry

    config = config_registry.native_qwen3_smoke()
    found = footprint.dry_run(config, Lora(rank=4), ranks=2)
    # 2 layers x (q 128x128 + k, v 128x64 + o 128x128 + gate, up 128x384 + down 384x128), each r x (in + out)
    expected = 2 * 4 * ((128 + 128) * 2 + (128 + 64) * 2 + (128 + 384) * 3)
    assert found.trainable == expected
    share = found.trainable / (found.trainable + found.frozen)
    for state in ("gradients", "optimizer"):
        assert found.per_rank[state] / found.full[state] == pytest.approx(share)
    assert found.per_rank["weights"] == found.full["weights"] == 4 * (found.trainable + found.frozen) / 2
    assert "trainable (" in found.line() and "full fine-tuning:" in found.line()


def test_continuing_an_adapter_takes_its_settings_and_refuses_others(tmp_path, dense_base):
    from neuron_qwen3.lora import folders

    (tmp_path / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 32,
                "lora_dropout": 0.05,
                "base_model_name_or_path": str(dense_base),
                "target_modules": ["v_proj", "q_proj"],
                "target_parameters": ["mlp.experts.down_proj"],
            }
        )
    )
    load = (f"--checkpoint.initial_load_path={tmp_path}", "--checkpoint.initial_load_in_hf")
    assert folders.resolve(parsed(*load, "--lora.targets=q_proj,v_proj,experts.down_proj")) == Lora(
        rank=8, alpha=32.0, dropout=0.05, targets="v_proj,q_proj,experts.down_proj", adapter=str(tmp_path)
    )
    with pytest.raises(targets.LoRAError) as caught:
        folders.resolve(parsed(*load, "--lora.rank=4", "--lora.targets=q_proj"))
    assert str(caught.value) == (
        f"INIT_FROM={tmp_path}: LORA_RANK=4 (the adapter's: 8), LORA_TARGETS=q_proj (the "
        "adapter's: experts.down_proj,q_proj,v_proj): unset them to continue the adapter "
        "as it is"
    )
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 8, "use_dora": True, "target_modules": ["q_proj"]})
    )
    with pytest.raises(targets.LoRAError, match="with use_dora: this image continues plain LoRA only"):
        folders.resolve(parsed(*load))
