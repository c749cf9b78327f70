"""DATASET: c4, a Hub dataset or local files, as text, conversations or preference pairs, into torchtitan.

records.py      which records: the source, resolved once; tables in a seeded order per epoch; `DataError`
conversations.py a record as text or as OpenAI-style messages (OpenAI, ShareGPT, prompt/completion), checked
pairs.py        a preference pair (TRL's three forms) as its chosen and rejected documents
tokens.py       how a record becomes tokens: the chat template's one rendering and the loss mask read from it
packing.py      documents into seq_len windows, positions restarting per document; conversations cut to fit
dataset.py      one rank's stateful stream of windows, and the counts of what it read; the validation shares
cache.py        the token cache: a local table tokenized once, in parallel, read by every rank of every run
mix.py          DATASET as a mix of local sources with weights: each epoch's records drawn by weight
loader.py       `DataLoader`, the torchtitan dataloader, and its Config (training or validation records)
epochs.py       EPOCHS: the steps N passes take, counted from the packed data
prompts.py      prompts for the generator, every accepted form read once: samples, GRPO, the offline command
scan.py         `scan`: a whole local file checked before launch; `render_first`: its first record rendered;
                `method_problem`: the data's kind against METHOD (pairs for dpo, prompts alone for grpo)
"""

from neuron_qwen3.data import epochs, mix
from neuron_qwen3.data.loader import DataLoader, tokenizer_of
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.scan import Scan, method_problem, render_first, scan

__all__ = ["DataError", "DataLoader", "Scan", "epochs", "method_problem", "mix", "render_first", "scan", "tokenizer_of"]
