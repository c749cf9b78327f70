"""Regenerate the bundled smoke assets: a synthetic corpus and a BPE tokenizer trained on it.

Both are made here, from nothing but this script, so they carry no third-party licence.
Run from the repo root:  .venv/bin/python recipes/neuron_qwen3/assets/make_assets.py
(the model config.json files alone, from shapes.py: tests/test_shapes.py regenerates and compares them).
The outputs are committed; the script is deterministic, so rerunning it reproduces them.
"""

import json
import random
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from neuron_qwen3 import shapes
from neuron_qwen3.data.tokens import IM_END, IM_START

HERE = Path(__file__).parent
CORPUS = HERE / "corpus" / "train.jsonl"
TOKENIZER_DIR = HERE / "tokenizer"
# config.json of the dense smoke and bench shapes as transformers models, for the v5 variant's AutoConfig offline
HF_CONFIGS = {"hf_qwen3_tiny": shapes.SMOKE, "hf_qwen3_bench_cpu": shapes.BENCH_CPU, "hf_qwen3_bench": shapes.BENCH}
VOCAB_SIZE = shapes.SMOKE.vocab_size
NUM_DOCUMENTS = 3000
EOS = "<|endoftext|>"
# Qwen3's chat markers are single tokens of its vocabulary, as here: the first two special (decode's
# skip_special_tokens drops them), the rest plain added tokens (Qwen3 decodes `<think>` as text). A served model
# ends its turn with the one <|im_end|> token, which generation_config.json makes a stop token as Qwen3's does.
SPECIAL_TOKENS = (IM_START, IM_END)
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Qwen3's chat layout (ChatML), written here from its documented behaviour: a system turn carrying the tools,
# assistant tool calls as <tool_call> JSON, tool results as <tool_response> blocks inside a user turn, and
# reasoning in <think> kept only for the assistant turns after the last user turn (an empty block on the final
# one). torchtitan's HuggingFaceTokenizer and transformers both read chat_template.jinja beside the tokenizer.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1] %}
        {%- else %}
            {%- set reasoning = '' %}
        {%- endif %}
        {%- if loop.index0 > ns.last_user and (loop.last or reasoning.strip()) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content.lstrip('\\n') }}
        {%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function else call %}
            {%- if content.strip() or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""
# tokenizer_config.json. The class makes transformers tokenize with tokenizer.json as it is, as the project does
# (torchtitan's HuggingFaceTokenizer): without one, a folder whose config.json says qwen3 (an export) gets
# Qwen2Tokenizer, which replaces the pre-tokenizer with Qwen's (digits one by one). PreTrainedTokenizerFast is the
# name transformers 4 and 5 both know. The pad token is Qwen3's, as generation_config.json's pad_token_id.
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": EOS,
    "pad_token": EOS,
    "add_bos_token": False,
    "model_max_length": 4096,
}

NOUNS = (
    "cat dog river engineer kernel compiler tensor router expert cluster node chip teacher garden city model".split()
)
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
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
        special_tokens=[EOS, *SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    tok.add_tokens([AddedToken(token, special=False, normalized=False) for token in ADDED_TOKENS])
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return tok


def hf_model_config(shape: shapes.Shape, eos_id: int) -> dict:
    """A config.json of `shape` (shapes.py) as transformers writes it, for the v5 variant's AutoConfig offline."""
    return {
        **shapes.hf_config(shape, eos_id),
        "max_position_embeddings": shapes.MAX_POSITIONS,
        "rope_parameters": {"rope_type": "default", "rope_theta": shapes.ROPE_THETA},
        "rms_norm_eps": 1e-6,
        "bos_token_id": None,
        "torch_dtype": "float32",
    }


def write_hf_configs(eos_id: int, root: Path = HERE) -> None:
    for folder, shape in HF_CONFIGS.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "config.json").write_text(json.dumps(hf_model_config(shape, eos_id), indent=2) + "\n")


def write_tokenizer_config(folder: Path = TOKENIZER_DIR) -> None:
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")


def main() -> None:
    docs = make_corpus(random.Random(0))
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    with CORPUS.open("w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(docs)
    tokenizer.save(str(TOKENIZER_DIR / "tokenizer.json"))
    write_tokenizer_config()
    (TOKENIZER_DIR / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    stops = [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(EOS)]
    generation = {"eos_token_id": stops, "pad_token_id": tokenizer.token_to_id(EOS), "do_sample": False}
    (TOKENIZER_DIR / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_hf_configs(tokenizer.token_to_id(EOS))
    print(f"wrote {len(docs)} documents to {CORPUS} and a {VOCAB_SIZE}-token tokenizer to {TOKENIZER_DIR}")


if __name__ == "__main__":
    main()
