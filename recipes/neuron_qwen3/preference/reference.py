"""The DPO reference model: what the policy's log-probabilities are measured against.

- `AdaptersOff`: with LoRA, the policy itself with every adapter's scale at 0 for the reference pass: the frozen
  base, with no second copy (TRL's reference for a PEFT model).
- `Frozen`: a second model of the same architecture, built and sharded as the policy is, loaded from a Hugging Face
  folder (INIT_FROM's weights, or DPO_REFERENCE's: TRL's `ref_model`), with no gradient and no optimizer state.
- `Precomputed` (DPO_PRECOMPUTE_REF=1, TRL's `precompute_ref_log_probs`): either of them runs once over every pair
  of the training and validation tables at the first step (`first_pass`), every start; the steps look each pair's
  sums up by its record, and a Frozen model is freed.

AdaptersOff and Frozen give `logps(inputs, labels, extra, temperature)`, the reference's token log-probabilities
(GRPO's KL reads them), and each gives `sums(inputs, labels, extra, records)`: the reference's [B, L/2, 2]
sequence log-probabilities.
"""

import contextlib
import gc
import time

import numpy as np
import torch
import torch.distributed as dist
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from neuron_qwen3.data import records as tables
from neuron_qwen3.data.dataset import PackedDataset, Shares
from neuron_qwen3.data.loader import table_reader
from neuron_qwen3.hf import load
from neuron_qwen3.lora import adapters as lora_adapters
from neuron_qwen3.preference.dpo import pair_sums
from neuron_qwen3.preference.logps import head_of, token_logps


class AdaptersOff:
    def __init__(self, model):
        self.model = model
        self.adapters = lora_adapters.adapters(model)
        assert self.adapters, "the adapters-off reference needs a model with LoRA adapters"

    @contextlib.contextmanager
    def _off(self):
        scales = [adapter.scale for adapter in self.adapters]
        for adapter in self.adapters:
            adapter.scale = 0.0
        try:
            yield
        finally:
            for adapter, scale in zip(self.adapters, scales):
                adapter.scale = scale

    def logps(self, inputs, labels, extra: dict, temperature: float = 1.0) -> torch.Tensor:
        with self._off():
            return token_logps(self.model(inputs, **extra), labels, temperature, head_of(self.model))[0]

    def sums(self, inputs, labels, extra: dict, records=None) -> torch.Tensor:
        return pair_sums(self.logps(inputs, labels, extra), labels, extra["positions"])[0]


class Frozen:
    def __init__(self, trainer, folder: str):
        begin = time.monotonic()
        config = trainer.config
        with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
            model = trainer.model_config.build()
        model = config.model_spec.parallelize_fn(
            model,
            parallel_dims=trainer.parallel_dims,
            training=config.training,
            parallelism=config.parallelism,
            compile_config=config.compile,
            ac_config=config.activation_checkpoint,
            dump_folder=config.dump_folder,
        )
        model.to_empty(device=trainer.device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)  # the buffers (RoPE); the weights come from the folder
        for param in model.parameters():
            param.requires_grad_(False)
        model.eval()
        keep = lambda key: not lora_adapters.is_adapter_key(key)  # noqa: E731 (a LoRA run's wrapper adds adapters)
        if not load.load([model], trainer.checkpointer.sd_adapter, folder, keep):
            raise ValueError(f"the DPO reference {folder}: its weights are not held as whole rows on every rank")
        self.model = model
        logger.info(f"DPO reference: {folder} loaded in {time.monotonic() - begin:.2f} s, sharded as the policy")

    def logps(self, inputs, labels, extra: dict, temperature: float = 1.0) -> torch.Tensor:
        return token_logps(self.model(inputs, **extra), labels, temperature, head_of(self.model))[0]

    def sums(self, inputs, labels, extra: dict, records=None) -> torch.Tensor:
        return pair_sums(self.logps(inputs, labels, extra), labels, extra["positions"])[0]


class Precomputed:
    """The sums of the pairs of `packed`'s table (the `role` its loader plays: training or validation), looked up
    by record. The first pass over the tables of every Precomputed sharing `passes` runs at the first micro-step,
    when the weights are loaded (LoRA's base is loaded as training starts); then a Frozen reference is freed."""

    def __init__(self, passes: dict, role: str, packed):
        self.passes, self.role = passes, role
        passes.setdefault("tables", {})[role] = packed

    def sums(self, inputs, labels, extra: dict, records=None) -> torch.Tensor:
        assert records is not None, "a precomputed reference needs each token's record"
        if "found" not in self.passes:
            reference = self.passes.pop("reference")
            trainer, prepare = self.passes["trainer"], self.passes["prepare"]
            self.passes["found"] = {
                role: first_pass(trainer, prepare, reference, packed)
                for role, packed in self.passes.pop("tables").items()
            }
            del reference
            gc.collect()  # a Frozen model's weights go with it (FSDP's states sit in reference cycles)
        of_pair = pair_records(records, extra["positions"])
        return self.passes["found"][self.role][of_pair.clamp_min(0)] * (of_pair >= 0)[..., None]


def first_pass(trainer, prepare, reference, packed) -> torch.Tensor:
    """The reference's sums of every pair of `packed`'s table (a PackedDataset of pairs): [records, 2], the same
    on every rank (`prepare`: the trainer's torchtitan post_dataloading_process, without the run hooks'). Every
    rank packs the whole table alike and runs its share of the windows in equal batches (the validation's
    Shares), then the ranks' sums are added up (each pair is in one rank's windows)."""
    begin, seen = time.monotonic(), trainer.ntokens_seen
    table = packed.reader.table
    whole = PackedDataset(
        table_reader(table, tables.Order(np.arange(len(table)), 0, 0, 1)),
        packed.kind,
        packed.field,
        packed.encoder,
        packed.seq_len,
        packed.pad_id,
        infinite=False,
    )
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    batch = trainer.config.training.local_batch_size
    found = torch.zeros(len(table), 2, dtype=torch.float64, device=trainer.device)
    for inputs, labels in _batches(Shares(whole, rank, world, batch), batch):
        of_token = inputs.pop("record").to(trainer.device)
        inputs = {key: value.to(trainer.device) for key, value in inputs.items()}
        tokens, labels, extra = prepare(inputs, labels.to(trainer.device))
        with torch.no_grad():
            sums = reference.sums(tokens, labels, extra)
        of_pair = pair_records(of_token, extra["positions"])
        found.index_put_((of_pair[of_pair >= 0],), sums[of_pair >= 0].double(), accumulate=True)
    trainer.ntokens_seen = seen  # the pass trains nothing
    if dist.is_initialized():
        dist.all_reduce(found)
    logger.info(
        f"DPO reference: the log-probabilities of {len(table)} records' pairs computed in "
        f"{time.monotonic() - begin:.1f} s, in one pass at the first step"
    )
    return found.float()


def pair_records(records_BL: torch.Tensor, positions_BL: torch.Tensor) -> torch.Tensor:
    """[B, L/2]: the record of each pair slot of dpo.pair_sums (its chosen document's), -1 where none."""
    B, L = records_BL.shape
    document = torch.cumsum((positions_BL == 0).long(), dim=1) - 1
    of_document = torch.full((B, L), -1, dtype=torch.long, device=records_BL.device).scatter(
        1, document, records_BL.long()
    )
    return of_document.view(B, L // 2, 2)[..., 0]


def _batches(dataset, batch: int):
    windows = []
    for window in dataset:
        windows.append(window)
        if len(windows) == batch:
            yield (
                {key: torch.stack([w[0][key] for w in windows]) for key in windows[0][0]},
                torch.stack([w[1] for w in windows]),
            )
            windows = []
