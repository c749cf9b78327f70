"""Documents into `seq_len` windows that never leak: each document's positions restart at 0, and the models mask
attention per document from the positions (torchtitan's native models through their flex/varlen document
masks, the v5 backend through `attn_mask_type="block_causal"`), so a token never sees another document.

Inputs and labels are shifted within each document (the last token of one is never trained to predict the
first of the next), so a document of n tokens fills n - 1 positions. Text flows from one window into the next
(a long document continues there, its positions restarted); a conversation is kept whole in one window, so one
longer than the window is cut first (`fit`). A window that cannot take the next conversation, and the last
window of an epoch, is padded (labels IGNORE_INDEX, each pad run a document of its own); a window's `real` marks
the tokens that are not padding, for what counts tokens rather than labels (the MoE routers' losses).
"""

import torch
from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3.data.tokens import Document


def fit(doc: Document, seq_len: int) -> tuple[list, str | None]:
    """A conversation as window-sized documents, and how it was cut: None (it fits), "truncated" (at the last
    turn boundary that fits and keeps a trained token; later turns are left out) or "split" (no such boundary:
    consecutive window-sized pieces, each predicting the next tokens, those with nothing to train left out)."""
    if len(doc.labels) <= seq_len:
        return [doc], None
    first = next((i for i, label in enumerate(doc.labels) if label != IGNORE_INDEX), len(doc.labels))
    cut = max((turn for turn in doc.turns if first + 1 < turn <= seq_len + 1), default=None)
    if cut is not None:
        return [Document(doc.ids[:cut], doc.labels[: cut - 1], doc.turns, doc.messages)], "truncated"
    pieces = [
        Document(doc.ids[at : at + seq_len + 1], doc.labels[at : at + seq_len], [], doc.messages)
        for at in range(0, len(doc.labels), seq_len)
    ]
    return [piece for piece in pieces if piece.trained], "split"


def windows(lengths: list, seq_len: int, whole: bool, together: bool = False) -> int:
    """How many windows a Packer makes of one epoch, from label counts alone (`lengths`: each record's documents'
    `len(labels)`, in reading order; `together`: a record's documents share a window, as a preference pair's):
    the same pushes, pads and pops as Packer and PackedDataset, no tokens."""
    made = buffered = 0
    for docs in lengths:
        for k, n in enumerate(docs):
            room, filled = (sum(docs[k + 1 :]) if together else 0), buffered % seq_len
            if whole and filled and filled + n + room > seq_len:
                buffered += -buffered % seq_len
            buffered += n
        made, buffered = made + buffered // seq_len, buffered % seq_len
    return made + (1 if buffered else 0)


class Packer:
    """The token buffer of one rank; `whole`: a document never crosses into the next window (conversations);
    `records`: each window also says which record each token came from (`record`, -1 for padding), which DPO's
    precomputed reference log-probabilities are looked up by."""

    def __init__(self, seq_len: int, pad_id: int, whole: bool, records: bool = False):
        self.seq_len, self.pad_id, self.whole = seq_len, pad_id, whole
        self.inputs, self.labels, self.positions = [], [], []
        self.records = [] if records else None
        self.padding = 0
        self.pad_from = []  # where each pad run in the buffer begins and ends (a window's tail, or a whole window)

    def push(self, doc: Document, room: int = 0, record: int = -1) -> None:
        """`room`: positions the next documents need in the same window (a preference pair's rejected)."""
        filled = len(self.inputs) % self.seq_len  # a record's earlier documents may have filled whole windows
        if self.whole and filled and filled + len(doc.labels) + room > self.seq_len:
            self._pad()
        self.inputs += doc.ids[:-1]
        self.labels += doc.labels
        self.positions += range(len(doc.labels))
        if self.records is not None:
            self.records += [record] * len(doc.labels)

    def _pad(self) -> None:
        count = -len(self.inputs) % self.seq_len
        if count:
            self.pad_from.append((len(self.inputs), len(self.inputs) + count))
        self.inputs += [self.pad_id] * count
        self.labels += [IGNORE_INDEX] * count
        self.positions += range(count)
        if self.records is not None:
            self.records += [-1] * count
        self.padding += count

    def pop(self):
        """The next full window, or None."""
        if len(self.inputs) < self.seq_len:
            return None
        n = self.seq_len
        inputs, labels, positions = self.inputs[:n], self.labels[:n], self.positions[:n]
        del self.inputs[:n], self.labels[:n], self.positions[:n]
        real = torch.ones(n, dtype=torch.bool)
        for start, end in (run for run in self.pad_from if run[0] < n):
            real[start : min(end, n)] = False
        self.pad_from = [(max(0, start - n), end - n) for start, end in self.pad_from if end > n]
        offset = positions[0]  # a document continued from the previous window restarts at 0
        for i in range(n if offset else 0):
            if positions[i] == 0:
                break
            positions[i] -= offset
        window = {"input": torch.tensor(inputs), "positions": torch.tensor(positions), "real": real}
        if self.records is not None:
            window["record"] = torch.tensor(self.records[:n])
            del self.records[:n]
        return window, torch.tensor(labels)

    def flush(self):
        """What is left, padded to a window; None when nothing is."""
        if not self.inputs:
            return None
        self._pad()
        return self.pop()

    def state_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "labels": self.labels,
            "positions": self.positions,
            "padding": self.padding,
            "pad_from": self.pad_from,
            **({"records": self.records} if self.records is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.inputs, self.labels = list(state["inputs"]), list(state["labels"])
        self.positions, self.padding = list(state["positions"]), state["padding"]
        self.pad_from = [tuple(run) for run in state.get("pad_from", [])]  # a checkpoint from before: no marks
        if self.records is not None:
            self.records = list(state["records"])
