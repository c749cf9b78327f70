"""Preference pairs (data/pairs.py) and the DPO loss on packed windows (preference/dpo.py) against TRL itself.

- Tokens: for TRL's three forms (strings; a conversational prompt with a system prompt, tools and several turns;
  implicit prompts), a pair's chosen and rejected documents are TRL's DPOTrainer tokenization (its own
  `_prepare_dataset`): the same ids, and labels on exactly TRL's completion tokens.
- Bad records: one line each, naming what is wrong (the launcher adds the file and line: test_dpo.py).
- Packing: a pair's two documents share a window, never split; EPOCHS' window count is the packer's.
- The loss: the chosen and rejected of several pairs packed into two windows, with per-token logits from a
  transformers model, give TRL's DPOTrainer loss, rewards, accuracy and log-probabilities on the same records,
  for the sigmoid and IPO losses and the SFT term beside them.
Run: .venv/bin/python -m pytest tests/test_pairs.py -q
"""

import json
import types

import pytest
import torch

from qwen_size import SMOKE_TOKENIZER

pytestmark = pytest.mark.training  # imports torchtitan, transformers and TRL
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RECORDS = {
    "strings": {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    "conversational": {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "Paris?"},
        ],
        "tools": [WEATHER],
        "chosen": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
            }
        ],
        "rejected": [{"role": "assistant", "content": "Sunny, I guess."}],
    },
    "implicit": {
        "chosen": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Stone"}],
    },
}


@pytest.fixture(scope="module")
def encoder():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import Encoder

    return Encoder(HuggingFaceTokenizer(tokenizer_path=str(SMOKE_TOKENIZER)))


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOKE_TOKENIZER)


def trl_tokenized(records: list, tokenizer) -> list:
    """TRL's DPOTrainer._prepare_dataset on `records`: prompt_ids, chosen_ids, rejected_ids of each."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    trainer = types.SimpleNamespace(_tokenizer=tokenizer)
    args = DPOConfig(output_dir="/tmp/unused", max_length=None, report_to=[], use_cpu=True, bf16=False)
    return list(DPOTrainer._prepare_dataset(trainer, Dataset.from_list(records), tokenizer, args, "train"))


def documents(record, encoder):
    from neuron_qwen3.data import pairs

    return pairs.encode(pairs.pair(record), encoder)


@pytest.mark.parametrize("form", RECORDS)
def test_a_pair_is_trls_tokens_and_completion(form, encoder, hf_tokenizer):
    from torchtitan.components.loss import IGNORE_INDEX

    chosen, rejected = documents(RECORDS[form], encoder)
    theirs = trl_tokenized([RECORDS[form]], hf_tokenizer)[0]
    for doc, name in ((chosen, "chosen_ids"), (rejected, "rejected_ids")):
        assert doc.ids == theirs["prompt_ids"] + theirs[name]
        trained = [label for label in doc.labels if label != IGNORE_INDEX]
        assert trained == theirs[name]  # labels on exactly TRL's completion
        assert doc.labels[len(theirs["prompt_ids"]) - 1 :] == theirs[name]  # where TRL's completion is


BAD = [
    ({"prompt": "a", "chosen": "b"}, None),  # no rejected: not a pair at all
    ({"prompt": "a", "chosen": "b", "rejected": "b"}, "chosen and rejected are the same"),
    ({"chosen": "b", "rejected": "c"}, "prompt is not a string (missing)"),
    (
        {
            "prompt": [{"role": "user", "content": "a"}],
            "chosen": [{"role": "user", "content": "b"}],
            "rejected": [{"role": "assistant", "content": "c"}],
        },
        "chosen's answer does not begin with an assistant",
    ),
    (
        {
            "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "rejected": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "c"}],
        },
        "share no prompt",
    ),
    (
        {
            "chosen": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "d"},
            ],
            "rejected": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "less"},
                {"role": "assistant", "content": "d"},
            ],
        },
        "different prompts: message 3 differs, a user turn in chosen",
    ),
    (
        {
            "prompt": [{"role": "pirate", "content": "a"}],
            "chosen": [{"role": "assistant", "content": "b"}],
            "rejected": [{"role": "assistant", "content": "c"}],
        },
        "prompt: message 1: unknown role 'pirate'",
    ),
]


@pytest.mark.parametrize("record,problem", BAD)
def test_a_bad_pair_is_one_line_naming_the_problem(record, problem, encoder):
    from neuron_qwen3.data import pairs
    from neuron_qwen3.data.conversations import Problem

    if problem is None:
        assert not pairs.is_pair(record)
        return
    with pytest.raises(Problem) as raised:
        documents(record, encoder)
    assert problem in str(raised.value) and "\n" not in str(raised.value)


def test_a_scan_names_the_file_and_line_of_a_bad_pair(tmp_path):
    from neuron_qwen3 import data

    path = tmp_path / "pairs.jsonl"
    path.write_text(
        json.dumps(RECORDS["strings"]) + "\n" + json.dumps({**RECORDS["strings"], "rejected": " blue."}) + "\n"
    )
    found = data.scan(str(path))
    assert found.kind == "pair"
    assert found.problem == f"{path}:2: chosen and rejected are the same"


def stream(records, encoder, seq_len, tmp_path):
    """Every window a rank packs of `records` (one epoch, in file order), and the dataset's counts."""
    import numpy as np

    from neuron_qwen3.data import records as tables
    from neuron_qwen3.data.dataset import PackedDataset

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = tables.local_table(str(path))
    reader = tables.TableReader(table, tables.Order(np.arange(len(table)), 0, 0, 1))
    dataset = PackedDataset(reader, "pair", "text", encoder, seq_len, 0, infinite=False)
    return list(dataset), dataset.stats()


def test_pairs_share_a_window_and_one_too_long_is_dropped_and_counted(encoder, tmp_path):
    import numpy as np

    from neuron_qwen3.data import records as tables
    from neuron_qwen3.data.dataset import documents as split
    from neuron_qwen3.data.packing import windows
    from neuron_qwen3.preference.dpo import pair_sums

    records = [RECORDS["implicit"], RECORDS["conversational"], RECORDS["strings"]] * 3
    seq_len = 96
    lengths = [sum(len(d.labels) for d in documents(r, encoder)) for r in records]
    assert max(lengths) > seq_len >= sorted(lengths)[-4]  # the tool pair does not fit, the others do
    got, counts = stream(records, encoder, seq_len, tmp_path)
    kept = [n for n in lengths if n <= seq_len]
    assert counts["dropped"] == len(records) - len(kept) == 3 and counts["records"] == len(records)
    pairs = []
    for inputs, labels in got:
        _, trained = pair_sums(torch.zeros(1, seq_len), labels[None], inputs["positions"][None])
        found = trained[0][trained[0].sum(-1) > 0]
        assert (found > 0).all(), "a chosen without its rejected in the window, or the reverse"
        pairs += found.tolist()
    assert len(pairs) == len(kept)
    order = tables.Order(np.arange(len(records)), 0, 0, 1).epoch(0).tolist()  # the reader's seeded order
    per_record = [[len(d.labels) for d in split(records[i], "pair", "text", encoder, seq_len)[1]] for i in order]
    assert windows(per_record, seq_len, True, together=True) == len(got)  # EPOCHS counts what the packer makes


# ---- the loss, against TRL's on the same records ---------------------------------------------------------------


def save_dense(folder, seed):
    import transformers

    from neuron_qwen3 import config_registry

    torch.manual_seed(seed)
    shape = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape))
    model.save_pretrained(folder)
    return model.eval()


def packed(records, encoder, seq_len=256):
    """Each record's chosen and rejected, packed two pairs to a row: (labels, positions, documents) where
    documents[b] lists the row's documents in order."""
    from torchtitan.components.loss import IGNORE_INDEX

    rows = []
    for first in range(0, len(records), 2):
        docs = [d for r in records[first : first + 2] for d in documents(r, encoder)]
        labels = sum((d.labels for d in docs), [])
        positions = sum((list(range(len(d.labels))) for d in docs), [])
        pad = seq_len - len(labels)
        rows.append((labels + [IGNORE_INDEX] * pad, positions + list(range(pad)), docs))
    return rows


def our_metrics(records, encoder, policy, reference, beta, kind, sft_weight):
    """The project's DPO (preference/dpo.py) on the packed rows, each document's logits from its own forward."""
    from neuron_qwen3.preference.dpo import Dpo, pair_sums, token_logps

    rows = packed(records, encoder)
    seq_len = len(rows[0][0])

    def logits(model):
        out = []
        for _, _, docs in rows:
            parts = [model(torch.tensor([d.ids[:-1]])).logits[0] for d in docs]
            row = torch.cat(parts)
            out.append(torch.cat([row, torch.zeros(seq_len - len(row), row.shape[-1])]))
        return torch.stack(out)

    labels = torch.tensor([r[0] for r in rows])
    positions = torch.tensor([r[1] for r in rows])
    frozen = types.SimpleNamespace(
        sums=lambda inputs, labels, extra, records: pair_sums(
            token_logps(logits(reference), labels)[0], labels, extra["positions"]
        )[0]
    )  # as reference.Frozen's
    loss = Dpo(policy, frozen, beta, kind, sft_weight, accumulation=1)
    with torch.no_grad():
        loss.reference_pass(None, labels, {"positions": positions})
        total, _ = loss(logits(policy), labels)
    return float(total), loss.interval()


def trl_metrics(records, tmp_path, policy, reference, beta, loss_types, weights):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path / "trl"),
        beta=beta,
        loss_type=loss_types,
        loss_weights=weights,
        per_device_train_batch_size=len(records),
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = DPOTrainer(
        model=policy,
        ref_model=reference,
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=AutoTokenizer.from_pretrained(SMOKE_TOKENIZER),
    )
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    return float(loss), {key: values[-1] for key, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("kind,sft_weight", [("sigmoid", 0.0), ("ipo", 0.0), ("sigmoid", 0.5)])
def test_the_packed_loss_is_trls(kind, sft_weight, encoder, tmp_path):
    records = [
        {
            "prompt": [{"role": "user", "content": question}],
            "chosen": [{"role": "assistant", "content": good}],
            "rejected": [{"role": "assistant", "content": bad}],
        }  # one form: TRL reads a table of one
        for question, good, bad in (
            ("Is 4 even?", "yes", "no"),
            ("Name a colour.", "Blue.", "Stone"),
            ("2+3?", "5", "It is six."),
            ("Capital of France?", "Lyon", "Paris"),
        )
    ]
    policy, reference = save_dense(tmp_path / "policy", 0), save_dense(tmp_path / "reference", 1)
    beta = 0.3
    ours, means = our_metrics(records, encoder, policy, reference, beta, kind, sft_weight)
    types_, weights = ([kind, "sft"], [1.0, sft_weight]) if sft_weight else ([kind], None)
    theirs, metrics = trl_metrics(records, tmp_path, policy, reference, beta, types_, weights)
    assert ours == pytest.approx(theirs, rel=1e-5)
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    ):
        # the margin is a difference of two rewards: its error is bounded by theirs, 1e-5 of each
        terms = abs(metrics["rewards/chosen"]) + abs(metrics["rewards/rejected"]) if name == "rewards/margins" else 0
        assert means[f"dpo/{name}"] == pytest.approx(metrics[name], rel=1e-5, abs=max(1e-6, 1e-5 * terms)), name
    assert means["dpo/pairs"] == len(records)
