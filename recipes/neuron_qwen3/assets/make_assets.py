"""Regenerate the bundled smoke assets: a synthetic corpus and a BPE tokenizer trained on it.

Both are made here, from nothing but this script, so they carry no third-party licence.
Run from the repo root:  .venv/bin/python recipes/neuron_qwen3/assets/make_assets.py
The outputs are committed; the script is deterministic, so rerunning it reproduces them.
"""

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).parent
CORPUS = HERE / "corpus" / "train.jsonl"
TOKENIZER_DIR = HERE / "tokenizer"
HF_MODEL_DIR = HERE / "hf_qwen3_tiny"
HF_BENCH_DIR = HERE / "hf_qwen3_bench"  # the bench scale's shapes (config_registry.BENCH*), for the v5 variant
HF_BENCH_ACCELERATOR_DIR = HERE / "hf_qwen3_bench_accelerator"
VOCAB_SIZE = 2048
NUM_DOCUMENTS = 3000
EOS = "<|endoftext|>"
# ChatML's layout with plain-text markers (the 2048-token vocabulary has no room for <|im_start|> as a special
# token); torchtitan's HuggingFaceTokenizer and transformers both read chat_template.jinja beside the tokenizer.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

NOUNS = "cat dog river engineer kernel compiler tensor router expert cluster node chip teacher garden city model".split()
ADJECTIVES = "quiet bright slow rapid patient careful large small warm cold sparse dense".split()
VERBS = "reads follows builds trains measures moves sorts watches carries checks".split()
PLACES = "near the river|in the lab|on the hill|under the bridge|inside the data centre|beside the old mill".split("|")
SYLLABLES = "ka lo mi ren sa tu vel no ri as ten bor qui fa del un zo pre".split()


def invented_names(rng: random.Random, count: int) -> list[str]:
    """Made-up proper names: they give the tokenizer enough distinct text to learn a full vocabulary."""
    names = set()
    while len(names) < count:
        names.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randrange(2, 5))).capitalize())
    return sorted(names)


def sentence(rng: random.Random, names: list[str]) -> str:
    kind = rng.randrange(5)
    if kind == 4:
        a, b = rng.sample(names, 2)
        return f"{a} {rng.choice(VERBS)} {b} {rng.choice(PLACES)}, and {a} smiles."
    if kind == 0:
        a, b = rng.sample(NOUNS, 2)
        return f"The {rng.choice(ADJECTIVES)} {a} {rng.choice(VERBS)} the {b} {rng.choice(PLACES)}."
    if kind == 1:
        x, y = rng.randrange(50), rng.randrange(50)
        return f"{x} plus {y} is {x + y}."
    if kind == 2:
        n = rng.randrange(2, 6)
        items = rng.sample(NOUNS, n)
        return f"The list holds {n} things: {', '.join(items)}."
    noun = rng.choice(NOUNS)
    return f"Every {noun} is {rng.choice(ADJECTIVES)}, and no {noun} is {rng.choice(ADJECTIVES)} twice."


def make_corpus(rng: random.Random) -> list[str]:
    names = invented_names(rng, 1500)
    return [" ".join(sentence(rng, names) for _ in range(rng.randrange(4, 16))) for _ in range(NUM_DOCUMENTS)]


def make_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return tok


def tiny_hf_qwen3_config(eos_id: int, dim=128, hidden=384, layers=2, heads=4, kv_heads=2, head_dim=32,
                         vocab=VOCAB_SIZE) -> dict:
    """A Qwen3ForCausalLM config.json (smoke size by default), for the v5 variant's AutoConfig offline."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": dim,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def write_bench_config(eos_id: int) -> None:
    shapes = {HF_BENCH_DIR: dict(dim=1024, hidden=3072, layers=16, heads=8, kv_heads=4, head_dim=128),
              HF_BENCH_ACCELERATOR_DIR: dict(dim=2048, hidden=6144, layers=28, heads=16, kv_heads=8, head_dim=128,
                                             vocab=151936)}
    for folder, shape in shapes.items():
        folder.mkdir(parents=True, exist_ok=True)
        config = tiny_hf_qwen3_config(eos_id, **shape)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    docs = make_corpus(random.Random(0))
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    with CORPUS.open("w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(docs)
    tokenizer.save(str(TOKENIZER_DIR / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": EOS, "add_bos_token": False, "model_max_length": 4096}
    (TOKENIZER_DIR / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (TOKENIZER_DIR / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    HF_MODEL_DIR.mkdir(parents=True, exist_ok=True)
    hf_config = tiny_hf_qwen3_config(tokenizer.token_to_id(EOS))
    (HF_MODEL_DIR / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    write_bench_config(tokenizer.token_to_id(EOS))
    print(f"wrote {len(docs)} documents to {CORPUS} and a {VOCAB_SIZE}-token tokenizer to {TOKENIZER_DIR}")


if __name__ == "__main__":
    main()
