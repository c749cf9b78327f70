"""rl/grpo.py against TRL 1.16's GRPOTrainer, in float32 on a tiny random Qwen3 (2 layers, hidden 64, vocab 300).

- The loss and its gradient: a real `trl.GRPOTrainer` (TRL's defaults but for the settings under test, so
  use_bias_correction_kl: the KL term times the differentiable ratio, which moves the gradient at beta > 0) runs its
  `compute_loss` on a generated batch injected as its `_generate_and_score_completions` hands it over (prompts
  left-padded, completions right-padded, one truncated, advantages, the generator's log-probabilities, the
  reference's, `num_items_in_batch`); `GrpoLoss` runs on the same batch laid out as neuron_qwen3 lays it out (one
  row per completion, labels IGNORE_INDEX but on the completion's tokens) with a copy of the same weights. The
  losses, the global gradient norms and three parameters' gradients agree to 1e-5 relative, as do the logged
  entropy, clip ratios and KL, over every loss type x beta 0 / 0.04 x one / two iterations (with two, the
  generator's log-probabilities are off by up to 0.5, so that tokens are clipped), and at temperature 0.7,
  clip-higher (epsilon_high 0.28), mask_truncated and two accumulation steps. The generator's own
  log-probabilities are off by other noise (its kernels are not the learner's on a device): the loss is TRL's,
  whose pi_old is the training model's, and the sampling difference |log pi - the generator's| is that offset.
- pi_old is the first pass's: the generation's first pass keeps its own log-probabilities (ratio 1 however far off
  the generator is) and a later pass, after an update, is clipped against them.
- The advantages: `advantages(rewards, generations, scale)` equals the advantages TRL's own
  `_generate_and_score_completions` computes for the same rewards (one of them None: unscorable, one group of equal
  rewards) at scale_rewards group, batch and none; `nanstd` equals `trl.trainer.utils.nanstd`.

Run: .venv/bin/python -m pytest tests/test_grpo_trl.py -q
"""

import pytest
import torch
from datasets import Dataset
from torchtitan.components.loss import IGNORE_INDEX
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd as trl_nanstd

from neuron_qwen3 import settings
from neuron_qwen3.preference.logps import token_logps
from neuron_qwen3.rl import grpo
from qwen_size import SMOKE_TOKENIZER

VOCAB, GENERATIONS, MAX_COMPLETION = 300, 3, 8
EOS = PAD = 0  # the smoke tokenizer's <|endoftext|>, its pad token too
PROMPT_LENGTHS = (6, 3)  # one prompt per group
# Each group's completions' lengths; the first completion runs to MAX_COMPLETION without an EOS (truncated), the
# last of the second group ends with an EOS at MAX_COMPLETION (not truncated); every other one ends with an EOS.
COMPLETION_LENGTHS = (MAX_COMPLETION, 5, 1, 7, 3, MAX_COMPLETION)
TRUNCATED = 0
REWARDS = (1.0, 0.2, -0.5, 0.3, 2.0, -1.0)
NOISE = 0.5  # an offset log-probability: the current ones plus uniform noise in [-NOISE, NOISE]
RTOL, ATOL = 1e-5, 1e-9
GRADS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight")

CASES = [
    dict(loss=loss, beta=beta, iterations=iterations)
    for loss in ("grpo", "dapo", "dr_grpo", "bnpo")
    for beta in (0.0, 0.04)
    for iterations in (1, 2)
] + [
    dict(loss="dapo", beta=0.04, iterations=2, temperature=0.7),
    dict(loss="dapo", beta=0.0, iterations=2, epsilon_high=0.28),
    dict(loss="grpo", beta=0.04, iterations=2, temperature=0.7, mask_truncated=True),
    dict(loss="bnpo", beta=0.04, iterations=2, accumulation=2),
    dict(loss="dapo", beta=0.04, iterations=2, accumulation=2),
    dict(loss="dapo", beta=0.0, iterations=2, accumulation=2),
    dict(loss="grpo", beta=0.0, iterations=1, accumulation=2),
]


def case_id(case: dict) -> str:
    return "-".join(f"{key}={value}" for key, value in case.items())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The policy (seed 0) and the reference (seed 1), each a Hugging Face folder."""
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    found = {}
    for name, seed in (("policy", 0), ("reference", 1)):
        torch.manual_seed(seed)
        found[name] = tmp_path_factory.mktemp(name)
        Qwen3ForCausalLM(config).save_pretrained(found[name])
    return found


def load(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")


def reward_of(values):
    """A reward function in TRL's signature that gives `values` in order (None: this one could not be scored)."""

    def reward(completions, **_):
        assert len(completions) == len(values)
        return list(values)

    return reward


def trainer(folders, tmp_path, rewards=REWARDS, **config) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=len(rewards),
        num_generations=GENERATIONS,
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=0,
        **config,
    )
    dataset = Dataset.from_list([{"prompt": "a b"}, {"prompt": "c"}])
    return GRPOTrainer(
        model=load(folders["policy"]),
        reward_funcs=reward_of(rewards),
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(SMOKE_TOKENIZER),
    )


def rollout(mask_truncated: bool) -> dict:
    """The generated batch: prompts [B, P] left-padded, completions [B, T] right-padded, and which tokens count."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in PROMPT_LENGTHS for _ in range(GENERATIONS)]
    completions = []
    for i, n in enumerate(COMPLETION_LENGTHS):
        tokens = torch.randint(1, VOCAB, (n,), generator=g)
        if i != TRUNCATED:
            tokens[-1] = EOS
        completions.append(tokens)
    width = max(PROMPT_LENGTHS)
    prompt_ids = torch.stack([torch.cat([torch.full((width - len(p),), PAD), p]) for p in prompts])
    prompt_mask = torch.stack([torch.arange(width) >= width - len(p) for p in prompts]).long()
    completion_ids = torch.stack([torch.cat([c, torch.full((MAX_COMPLETION - len(c),), PAD)]) for c in completions])
    completion_mask = torch.stack([torch.arange(MAX_COMPLETION) < len(c) for c in completions]).long()
    if mask_truncated:  # as _generate_and_score_completions: the last token neither EOS nor pad
        truncated = torch.tensor([int(c[-1]) not in (EOS, PAD) for c in completions])
        assert truncated.tolist() == [i == TRUNCATED for i in range(len(completions))]
        completion_mask = completion_mask * (~truncated).unsqueeze(1).long()
    return dict(
        prompts=prompts,
        completions=completions,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
    )


def neuron_rows(batch: dict, per_token: dict) -> tuple:
    """The batch as neuron_qwen3 lays it out: (inputs [B, L], labels [B, L], attention mask [B, L], each of
    `per_token` ([B, T] over the completion) moved to its label's position [B, L], 0 elsewhere)."""
    length = max(PROMPT_LENGTHS) + MAX_COMPLETION + 2  # L + 1, room for pads after the longest row
    rows = torch.full((len(batch["prompts"]), length), PAD)
    labels = torch.full((len(batch["prompts"]), length - 1), IGNORE_INDEX)
    attention = torch.zeros(len(batch["prompts"]), length - 1, dtype=torch.long)
    moved = {name: torch.zeros(len(batch["prompts"]), length - 1) for name in per_token}
    for i, (prompt, completion) in enumerate(zip(batch["prompts"], batch["completions"])):
        p, c = len(prompt), len(completion)
        rows[i, : p + c] = torch.cat([prompt, completion])
        attention[i, : p + c] = 1
        counted = batch["completion_mask"][i, :c].bool()
        at = torch.arange(p - 1, p + c - 1)[counted]  # completion token k is the label at p + k - 1
        labels[i, at] = rows[i, 1:][at]
        for name, values in per_token.items():
            moved[name][i, at] = values[i, :c][counted]
    return rows[:, :-1], labels, attention, moved


class Reference:
    """The `reference` GrpoLoss reads: `.logps(inputs, labels, extra, temperature)`, a frozen model's."""

    def __init__(self, model):
        self.model = model.eval().requires_grad_(False)

    def logps(self, inputs, labels, extra: dict, temperature: float) -> torch.Tensor:
        return token_logps(self.model(input_ids=inputs, **extra).logits, labels, temperature)[0]


def global_norm(model) -> torch.Tensor:
    return torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_loss_and_gradient_are_trls(folders, tmp_path, case):
    """GrpoLoss's loss, gradient and logged means equal TRL's `compute_loss` on the same batch and weights."""
    temperature = case.get("temperature", 1.0)
    accumulation = case.get("accumulation", 1)
    mask_truncated = case.get("mask_truncated", False)
    theirs = trainer(
        folders,
        tmp_path,
        loss_type=case["loss"],
        beta=case["beta"],
        num_iterations=case["iterations"],
        epsilon=0.2,
        epsilon_high=case.get("epsilon_high"),
        max_completion_length=MAX_COMPLETION,
        temperature=temperature,
        mask_truncated_completions=mask_truncated,
        gradient_accumulation_steps=accumulation,
    )
    reference = load(folders["reference"])
    if theirs.ref_model is not None:  # TRL builds its reference from the policy's folder: give it the reference's
        theirs.ref_model.load_state_dict(reference.state_dict())
    batch = rollout(mask_truncated)
    mask = batch["completion_mask"]
    advantages, _ = grpo.advantages(torch.tensor(REWARDS), GENERATIONS, "group")
    assert (advantages > 0).any() and (advantages < 0).any()

    # TRL's generated batch, its log-probabilities from its own `_get_per_token_logps_and_entropies`
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], mask], dim=1)
    tokens = mask.sum()
    # the step's (the generation batch's) completion tokens: this micro-batch's, and with two accumulation steps the
    # other micro-batch's, 5 more (dapo's divisor is then not bnpo's)
    step_tokens = tokens if accumulation == 1 else 2 * tokens + 5
    inputs = dict(
        prompt_ids=batch["prompt_ids"],
        prompt_mask=batch["prompt_mask"],
        completion_ids=batch["completion_ids"],
        completion_mask=mask,
        advantages=advantages,
        num_items_in_batch=step_tokens,
    )
    with torch.no_grad():
        # the generator's log-probabilities: the current ones at one iteration (TRL then takes none), the current
        # ones off by up to NOISE after an update
        current = theirs._get_per_token_logps_and_entropies(theirs.model, input_ids, attention_mask, MAX_COMPLETION)[0]
        noise = torch.zeros_like(current)
        if case["iterations"] > 1:
            g = torch.Generator().manual_seed(11)
            noise = (torch.rand(current.shape, generator=g) * 2 - 1) * NOISE
            inputs["old_per_token_logps"] = current + noise
        # ours: the generator's log-probabilities off by other noise (on a device its kernels are not the
        # learner's), and pi_old as the generation's first pass kept it (the learner's, TRL's old_per_token_logps)
        g = torch.Generator().manual_seed(12)
        generator_noise = (torch.rand(current.shape, generator=g) * 2 - 1) * NOISE
        per_token = {"old": current + generator_noise, "learner_old": current + noise}
        if case["beta"]:
            inputs["ref_per_token_logps"] = theirs._get_per_token_logps_and_entropies(
                theirs.ref_model, input_ids, attention_mask, MAX_COMPLETION
            )[0]
    theirs.model.train()  # as training_step: the train mode's normalizers and metrics
    theirs.current_gradient_accumulation_steps = accumulation  # as the training loop sets it for each step
    theirs._metrics["train"].clear()
    trl_loss = theirs.compute_loss(theirs.model, inputs)
    trl_loss.backward()
    logged = {name: values[-1] for name, values in theirs._metrics["train"].items()}

    # neuron_qwen3's
    ours = load(folders["policy"]).train()
    config = settings.Grpo(
        generations=GENERATIONS,
        max_completion=MAX_COMPLETION,
        temperature=temperature,
        beta=case["beta"],
        epsilon=0.2,
        epsilon_high=case.get("epsilon_high"),
        loss=case["loss"],
        iterations=case["iterations"],
        mask_truncated=mask_truncated,
    )
    rows, labels, attention, moved = neuron_rows(batch, per_token)
    assert (labels != IGNORE_INDEX).sum() == tokens
    extra = dict(attention_mask=attention, position_ids=torch.arange(rows.shape[1]).expand_as(rows))
    loss_fn = grpo.GrpoLoss(
        ours, config, accumulation=accumulation, ranks=1, reference=Reference(reference) if case["beta"] else None
    )
    kept = [moved["learner_old"]] if case["iterations"] > 1 else []
    loss_fn.prepare(rows, labels, extra, {"advantages": advantages, "old": moved["old"], "learner_old": kept})
    pred = ours(input_ids=rows, **extra).logits
    loss, _ = loss_fn(pred, labels, global_valid_tokens=step_tokens)
    loss.backward()
    metrics = loss_fn.interval()

    torch.testing.assert_close(loss, trl_loss, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(global_norm(ours), global_norm(theirs.model), rtol=RTOL, atol=ATOL)
    ours_by_name, theirs_by_name = dict(ours.named_parameters()), dict(theirs.model.named_parameters())
    for name in GRADS:
        expected = theirs_by_name[name].grad
        assert expected.abs().max() > 0, name
        # elementwise: 1e-5 relative, and 1e-5 of the tensor's largest entry absolute (entries that cancel to ~0)
        atol = RTOL * expected.abs().max().item()
        torch.testing.assert_close(
            ours_by_name[name].grad, expected, rtol=RTOL, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )

    assert metrics["grpo/entropy"] == pytest.approx(logged["entropy"], rel=RTOL)
    for name in ("low_mean", "high_mean", "region_mean"):
        assert metrics[f"grpo/clip_ratio/{name}"] == pytest.approx(logged[f"clip_ratio/{name}"], rel=RTOL, abs=1e-9)
    if case["iterations"] > 1:
        assert metrics["grpo/clip_ratio/region_mean"] > 0
    if case.get("epsilon_high"):
        assert metrics["grpo/clip_ratio/high_mean"] > 0
    # |log pi - the generator's| of a counted token: the generator's own offset, whatever the iterations
    counted = mask.bool()
    assert metrics["grpo/sampling/logp_difference/mean"] == pytest.approx(
        generator_noise[counted].abs().mean().item(), rel=1e-4
    )
    if case["beta"]:
        assert metrics["grpo/kl"] == pytest.approx(logged["kl"], rel=RTOL)
    else:
        assert "grpo/kl" not in metrics and "kl" not in logged


def test_pi_old_is_the_first_passs_own_log_probability(folders):
    """With two iterations, the generation's first pass keeps its own log-probabilities as pi_old: its ratio is 1
    although the generator's are 2 nats off, and the second pass, after an update, is clipped against them."""
    ours = load(folders["policy"]).train()
    config = settings.Grpo(generations=GENERATIONS, max_completion=MAX_COMPLETION, loss="grpo", iterations=2)
    batch = rollout(False)
    far = torch.full((len(batch["prompts"]), MAX_COMPLETION), -2.0)  # the generator's, far from the learner's
    rows, labels, attention, moved = neuron_rows(batch, {"old": far})
    extra = dict(attention_mask=attention, position_ids=torch.arange(rows.shape[1]).expand_as(rows))
    advantages, _ = grpo.advantages(torch.tensor(REWARDS), GENERATIONS, "group")
    loss_fn, kept = grpo.GrpoLoss(ours, config, accumulation=1, ranks=1), []

    def one_pass():
        loss_fn.prepare(rows, labels, extra, {"advantages": advantages, "old": moved["old"], "learner_old": kept})
        pred = ours(input_ids=rows, **extra).logits
        loss_fn(pred, labels, global_valid_tokens=(labels != IGNORE_INDEX).sum())[0].backward()
        return token_logps(pred.detach(), labels)[0], loss_fn.interval()

    first, metrics = one_pass()
    assert metrics["grpo/clip_ratio/region_mean"] == 0 and metrics["grpo/sampling/logp_difference/mean"] > 0.5
    assert len(kept) == 1 and torch.equal(kept[0], first)
    with torch.no_grad():  # an update large enough to move the ratio out of [0.8, 1.2] on some tokens
        for parameter in ours.parameters():
            parameter -= 50.0 * parameter.grad
            parameter.grad = None
    second, metrics = one_pass()
    assert not torch.equal(second, first)
    assert metrics["grpo/clip_ratio/region_mean"] > 0 and len(kept) == 1 and torch.equal(kept[0], first)


# Three groups: one with an unscorable completion (None), one of equal rewards (zero std), one spread
ADVANTAGE_REWARDS = (1.0, None, 0.5, 2.0, 2.0, 2.0, 0.0, -1.0, 3.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_are_trls(folders, tmp_path, scale):
    """advantages() equals the advantages TRL's `_generate_and_score_completions` computes from the same rewards,
    and its zero-std flags TRL's logged frac_reward_zero_std."""
    theirs = trainer(folders, tmp_path, rewards=ADVANTAGE_REWARDS, scale_rewards=scale, max_completion_length=4)
    theirs.model.train()
    prompts = [{"prompt": prompt} for prompt in ("a b", "c", "a") for _ in range(GENERATIONS)]
    out = theirs._generate_and_score_completions(prompts)
    assert int(out["prompt_ids"].max()) < VOCAB  # the prompts are in the tiny model's vocabulary

    rewards = torch.tensor([float("nan") if r is None else r for r in ADVANTAGE_REWARDS])
    found, zero_std = grpo.advantages(rewards, GENERATIONS, scale)
    torch.testing.assert_close(found, out["advantages"], rtol=1e-6, atol=1e-7)
    assert found[1] == 0 and found.isfinite().all()
    # the flags: the group's std is 0 (the batch's with scale "batch"), TRL's frac_reward_zero_std their mean
    expected = [False] * 9 if scale == "batch" else [False] * 3 + [True] * 3 + [False] * 3
    assert zero_std.tolist() == expected
    assert zero_std.float().mean().item() == pytest.approx(theirs._metrics["train"]["frac_reward_zero_std"][-1])


def test_advantages_of_every_rank_use_the_batch_std():
    """With scale "batch", `everyone` (every rank's rewards) gives the std, as TRL's std over the gathered rewards;
    the means stay per group."""
    everyone = torch.tensor([1.0, float("nan"), 0.5, 2.0, 4.0, -3.0])
    found, _ = grpo.advantages(everyone[:3], GENERATIONS, "batch", everyone=everyone)
    whole, _ = grpo.advantages(everyone, GENERATIONS, "batch")
    torch.testing.assert_close(found, whole[:3], rtol=0, atol=0)
    alone, _ = grpo.advantages(everyone[:3], GENERATIONS, "batch")
    assert not torch.allclose(found, alone)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_nanstd_is_trls(dim):
    """nanstd equals TRL's over rows with NaNs, a single value (NaN: no sample std) and none."""
    g = torch.Generator().manual_seed(3)
    values = torch.randn(5, 4, generator=g)
    values[0, 1] = values[2, :3] = values[3] = float("nan")
    found = grpo.nanstd(values, dim=dim)
    expected = trl_nanstd(values, dim=dim)
    assert found.shape == expected.shape
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=0, equal_nan=True)
    assert found.isfinite().any()
    if dim == 1:
        assert found[2:4].isnan().all() and found[[0, 1, 4]].isfinite().all()
