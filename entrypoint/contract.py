"""The environment contract: every variable the container reads, the torchtitan flag it becomes, and its parser.

This table is the interface: `--help` and the docs' tables are rendered from it, the tests iterate over it. Values
are parsed once, to their final types; bad input is one line naming the variable and what it accepts.
"""

import typing
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass

from entrypoint.values import (
    IDENTIFIER,
    WORD,
    UsageError,
    choice,
    comma_list,
    core_list,
    dataset,
    decimal,
    host,
    integer,
    keep_count,
    lnc,
    local_ranks,
    matching,
    module_name,
    node_list,
    non_negative_int,
    path,
    port,
    positive_int,
    procs_per_node,
    qwen3_id,
    seconds,
    shell_words,
    switch,
    text,
    validation,
    word,
)
from entrypoint.variants import DEFAULT_VARIANT, RECIPE_MODULE, SCALES, VARIANTS


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None  # None: unset unless given
    parse: Callable[[str], object]  # raises ValueError outside `parse.allowed`; its return type is the field's
    meaning: str
    group: str = "run"  # the docs table it is listed in (ci/docs.py)
    flag: str = ""  # the torchtitan flag(s) the workers get; one `--section.field` token is passed `--x=value`
    secret: bool = False  # never shown: not in Settings' repr, redacted from every line the launcher prints

    @property
    def allowed(self) -> str:
        return self.parse.allowed


VARS = (
    Var(
        "VARIANT",
        DEFAULT_VARIANT,
        choice(*VARIANTS),
        "which Qwen3 setup to train (`--list`)",
        flag="--config (with SCALE)",
    ),
    Var(
        "SCALE",
        "full",
        choice(*SCALES),
        "`full`: the article's model on every core; `smoke`: a tiny model, "
        "bundled assets, offline; `bench`: bundled assets, offline, a model for throughput (CPU: 0.2B, sequence "
        "2048; GPU/Neuron: Qwen3-1.7B's shape, sequence 4096)",
        flag="--config (with VARIANT)",
    ),
    Var(
        "MODEL",
        None,
        qwen3_id,
        "full scale: which Qwen3 to train, of the variant's family (dense, MoE); default: the variant's",
        flag="--config --report.model",
    ),
    Var(
        "CONFIG",
        None,
        matching(IDENTIFIER, "a config function name (letters, digits, `_`)"),
        "any config function of MODULE, as torchtitan's `--config`; replaces the one VARIANT and SCALE pick",
        flag="--config",
    ),
    Var(
        "MODULE",
        RECIPE_MODULE,
        module_name,
        "the recipes module (torchtitan's `--module`): mount your own and set CONFIG",
        flag="--module",
    ),
    Var(
        "DEVICE",
        "auto",
        choice("auto", "neuron", "cuda", "cpu"),
        "where to train; `auto`: Neuron if found, else CUDA, else CPU",
        flag="--device (the kind found)",
    ),
    Var("LOG_RANK", "0", local_ranks, "whose output the console shows; every rank's log is kept in OUTPUT_DIR"),
    Var(
        "COMPILE",
        "0",
        switch,
        "torch.compile (backend `neuron` on Trainium, `inductor` elsewhere)",
        flag="--compile.enable --compile.backend",
    ),
    Var("STEPS", None, positive_int, "training steps; default: the config's", flag="--training.steps"),
    Var(
        "LR",
        None,
        decimal("a number from 0 to 1, like 2e-5", 0, 1, from_low=True),
        "peak learning rate, every "
        "param group (0: the weights stay); default: the config's (8e-4), 2e-5 with INIT_FROM (torchtitan's Qwen3 "
        "SFT)",
        flag="--tune.lr",
    ),
    Var(
        "WARMUP_STEPS",
        None,
        matching(r"\d+|0?\.\d*[1-9]\d*", "whole steps, or a fraction of the steps below 1 like 0.03"),
        "linear warm-up to LR; default: the config's, 0.08 with INIT_FROM",
        flag="--tune.warmup",
    ),
    Var(
        "LR_SCHEDULE",
        None,
        choice("linear", "sqrt", "cosine"),
        "decay after the warm-up (torchtitan's kinds); "
        "default: the config's (linear); constant: EXTRA_ARGS=--lr_scheduler.decay_ratio=0",
        flag="--lr_scheduler.decay_type",
    ),
    Var(
        "BATCH_SIZE",
        None,
        positive_int,
        "sequences per step, a multiple of the local batch x data-parallel ranks "
        "(the rest is gradient accumulation); default: one of each",
        flag="--training.global_batch_size",
    ),
    Var("SEQ_LEN", None, positive_int, "tokens per sequence; default: the config's", flag="--training.seq_len"),
    Var(
        "SEED",
        None,
        integer("an integer from 0 to 4294967295", 0, 2**32 - 1),
        "torchtitan's RNG seed (model initialisation); default: the config's (0 at smoke, else rank 0 draws one)",
        flag="--debug.seed",
    ),
    Var(
        "NPROC",
        None,
        positive_int,
        "processes per node; default PET_NPROC_PER_NODE, else one per logical NeuronCore or GPU, 1 on CPU",
    ),
    Var(
        "EXTRA_ARGS",
        "",
        shell_words,
        "more torchtitan arguments, last (before the command line's); flags the launcher owns are refused",
    ),
    Var(
        "INIT_FROM",
        None,
        text("`hub` or a path to a Hugging Face model folder or PEFT adapter folder"),
        "unset: "
        "random init; `hub`: MODEL's Hub weights (full scale); a path: a local model folder (`config.json` + "
        "`*.safetensors`), loaded through torchtitan's state-dict adapter; an adapter folder: LoRA continues it",
        flag="--checkpoint.initial_load_path --checkpoint.initial_load_in_hf --checkpoint.initial_load_model_only",
    ),
    Var(
        "EXPORT_DIR",
        None,
        path,
        "after training (also when the data runs out), a Hugging Face model "
        "folder there (config.json, safetensors in the Hub's sharded layout, tokenizer): every rank writes its own "
        "part, the folder is renamed into place",
        flag="--export.dir",
    ),
    Var(
        "EXPORT_DTYPE",
        "bfloat16",
        choice("bfloat16", "float32"),
        "dtype of the exported weights",
        flag="--export.dtype",
    ),
    Var(
        "EXPORT_MAX_SHARD_MB",
        "5000",
        positive_int,
        "the export's largest safetensors file, in MB (the Hub's 5GB)",
        flag="--export.max_shard_mb",
    ),
    Var(
        "LORA_RANK",
        None,
        positive_int,
        "LoRA adapters of this rank over INIT_FROM's frozen weights (EXPORT_DIR: a "
        "PEFT adapter folder); unset: full fine-tuning",
        flag="--lora.rank",
    ),
    Var(
        "LORA_ALPHA",
        None,
        decimal("a positive number", 0, float("inf")),
        "the update is scaled by alpha / rank; default: 2 x rank",
        flag="--lora.alpha",
    ),
    Var(
        "LORA_DROPOUT",
        None,
        matching(r"0|0?\.\d+", "a number from 0 to below 1"),
        "dropout on the adapters' input (not on MoE experts)",
        flag="--lora.dropout",
    ),
    Var(
        "LORA_TARGETS",
        None,
        matching(r"[a-z_.]+(,[a-z_.]+)*", "a comma list of projection names"),
        "default: the "
        "7 attention and MLP projections (dense), the 4 attention ones (MoE; add experts.gate_up_proj, "
        "experts.down_proj)",
        flag="--lora.targets",
    ),
    Var(
        "EXPORT_MERGED",
        "0",
        switch,
        "with LoRA: the merged model at EXPORT_DIR, the adapter in EXPORT_DIR/adapter",
        flag="--export.merged",
    ),
    Var(
        "MOE_AUX_LOSS",
        None,
        decimal("a number from 0, like 0.001", 0, float("inf"), from_low=True),
        "MoE: the coefficient of Qwen3-MoE's load-balancing loss (transformers' load_balancing_loss_func) added to "
        "the loss; 0: off; default: INIT_FROM's router_aux_loss_coef, else 0.001",
        flag="--moe.aux_loss",
    ),
    Var(
        "MOE_Z_LOSS",
        None,
        decimal("a number from 0, like 0.001", 0, float("inf"), from_low=True),
        "MoE: the coefficient of the router z-loss (ST-MoE); default: 0",
        flag="--moe.z_loss",
    ),
    Var(
        "MOE_ROUTER",
        None,
        choice("train", "freeze"),
        "MoE: freeze keeps every router at INIT_FROM's weights, out of the optimizer; default: train",
        flag="--moe.router",
    ),
    Var(
        "METHOD",
        "sft",
        choice("sft", "dpo", "grpo"),
        "sft: train on the data's tokens; dpo: on preference pairs (TRL's "
        "prompt/chosen/rejected records) against a reference model; grpo: online RL on completions the model "
        "generates for prompt-only records, scored by GRPO_REWARDS (TRL's GRPOTrainer)",
        flag="--preference.method",
    ),
    Var(
        "DPO_BETA",
        None,
        decimal("a positive number, like 0.1", 0, float("inf")),
        "DPO: how far the policy may move from the reference (TRL's beta); default: 0.1",
        flag="--preference.beta",
    ),
    Var(
        "DPO_LOSS",
        None,
        choice("sigmoid", "ipo"),
        "DPO: sigmoid (DPO) or ipo, as TRL computes them; default: sigmoid",
        flag="--preference.loss",
    ),
    Var(
        "DPO_SFT_WEIGHT",
        None,
        decimal("a number from 0, like 1", 0, float("inf"), from_low=True),
        "DPO: the weight of an SFT term on the chosen completions (RPO; TRL's `sft` loss beside `sigmoid`); default: 0",
        flag="--preference.sft_weight",
    ),
    Var(
        "DPO_PRECOMPUTE_REF",
        "0",
        switch,
        "DPO: the reference's log-probabilities of every pair in one pass at "
        "the first step, then looked up: no reference forward per step, a frozen reference freed",
        flag="--preference.precompute",
    ),
    Var(
        "DPO_REFERENCE",
        None,
        path,
        "DPO: the reference model, a Hugging Face folder of the policy's "
        "architecture (TRL's ref_model); default: with LoRA the base (adapters off), else INIT_FROM's weights",
        flag="--preference.reference",
    ),
    Var(
        "GRPO_REWARDS",
        None,
        matching(r"[\w.:]+(,[\w.:]+)*", "a comma list of accuracy, format, length or module:function"),
        "GRPO: the reward functions, built in (accuracy, format, length) or `module:function` with TRL's "
        "signature, imported with DATASET's folder first on the path",
        flag="--grpo.rewards",
    ),
    Var(
        "GRPO_REWARD_WEIGHTS",
        None,
        matching(r"-?[\d.]+(e-?\d+)?(,-?[\d.]+(e-?\d+)?)*", "a comma list of numbers, one per reward"),
        "GRPO: each reward's weight in the total; default: 1 each",
        flag="--grpo.reward_weights",
    ),
    Var(
        "GRPO_GENERATIONS",
        None,
        integer("an integer from 2", 2),
        "GRPO: completions per prompt, a group (TRL's num_generations); it divides BATCH_SIZE per rank; default: 8",
        flag="--grpo.generations",
    ),
    Var(
        "GRPO_MAX_COMPLETION",
        None,
        positive_int,
        "GRPO: the most tokens a completion takes (max_completion_length); default: 512",
        flag="--grpo.max_completion",
    ),
    Var(
        "GRPO_TEMPERATURE",
        None,
        decimal("a positive number, like 1.0", 0, float("inf")),
        "GRPO: the sampling temperature; default: 1.0",
        flag="--grpo.temperature",
    ),
    Var(
        "GRPO_TOP_P",
        None,
        decimal("a number above 0, at most 1", 0, 1),
        "GRPO: nucleus sampling; default: 1 (off)",
        flag="--grpo.top_p",
    ),
    Var("GRPO_TOP_K", None, non_negative_int, "GRPO: top-k sampling; default: 0 (off)", flag="--grpo.top_k"),
    Var(
        "GRPO_BETA",
        None,
        decimal("a number from 0, like 0.04", 0, float("inf"), from_low=True),
        "GRPO: the KL penalty's coefficient; above 0 a reference as DPO's; default: 0 (none)",
        flag="--grpo.beta",
    ),
    Var(
        "GRPO_EPSILON",
        None,
        decimal("a number from 0, like 0.2", 0, float("inf"), from_low=True),
        "GRPO: the ratio's lower clip, 1 - epsilon; default: 0.2",
        flag="--grpo.epsilon",
    ),
    Var(
        "GRPO_EPSILON_HIGH",
        None,
        decimal("a number from 0, like 0.28", 0, float("inf"), from_low=True),
        "GRPO: the ratio's upper clip, 1 + epsilon_high (DAPO's clip-higher); default: GRPO_EPSILON",
        flag="--grpo.epsilon_high",
    ),
    Var(
        "GRPO_LOSS",
        None,
        choice("dapo", "grpo", "dr_grpo", "bnpo"),
        "GRPO: how token losses are averaged, as TRL's loss_type; default: dapo",
        flag="--grpo.loss",
    ),
    Var(
        "GRPO_SCALE_REWARDS",
        None,
        choice("group", "batch", "none"),
        "GRPO: advantages divided by the group's reward std, the batch's, or not; default: group",
        flag="--grpo.scale_rewards",
    ),
    Var(
        "GRPO_ITERATIONS",
        None,
        positive_int,
        "GRPO: optimizer steps on each generated batch (TRL's num_iterations); default: 1",
        flag="--grpo.iterations",
    ),
    Var(
        "GRPO_MASK_TRUNCATED",
        None,
        switch,
        "GRPO: a completion cut by GRPO_MAX_COMPLETION counts for nothing; default: 0",
        flag="--grpo.mask_truncated",
    ),
    Var(
        "GRPO_SEED",
        None,
        non_negative_int,
        "GRPO: the sampler's seed, drawn per rank and step so a resumed run draws the same; default: 0",
        flag="--grpo.seed",
    ),
    Var(
        "DATASET",
        None,
        dataset,
        "training data; default: the config's (c4 at full scale, the bundled corpus at "
        "smoke); local files are read offline; a mix draws each epoch's records from its sources by weight",
        flag="--dataloader.source",
    ),
    Var(
        "DATASET_FIELD",
        "text",
        matching(WORD, "a field name (letters, digits, `.`, `_`, `-`)"),
        "the record field "
        "that holds the text, or a conversation (`messages`, ShareGPT `conversations`; `prompt` + `completion` "
        "records are one turn), which makes the run SFT",
        flag="--dataloader.field",
    ),
    Var(
        "TRAIN_ON",
        "assistant",
        choice("assistant", "last", "all"),
        "conversations: the tokens that count in the loss: every assistant turn, the final one, or every token",
        flag="--dataloader.train_on",
    ),
    Var(
        "VALIDATION",
        None,
        validation,
        "held-out data (same formats as DATASET), or that share of DATASET's "
        "records (seeded, never trained on): its mean loss every VALIDATION_INTERVAL steps and after the last",
        flag="--dataloader.validation",
    ),
    Var(
        "VALIDATION_INTERVAL",
        None,
        positive_int,
        "steps between validations; default: the config's",
        flag="--validator.freq",
    ),
    Var(
        "EPOCHS",
        None,
        positive_int,
        "passes over a local DATASET, each reshuffled; the steps are derived from the packed data (not with STEPS)",
        flag="--dataloader.epochs",
    ),
    Var(
        "SAMPLE_PROMPTS",
        None,
        path,
        "a local file of conversations (DATASET's formats) the model answers "
        "greedily at step 0, every SAMPLE_INTERVAL steps and after the last: "
        "report/samples.md; default: none (smoke: three bundled prompts); empty: none",
        flag="--samples.prompts",
    ),
    Var(
        "SAMPLE_TOKENS",
        None,
        positive_int,
        "the most new tokens a sample answer takes; default: 48",
        flag="--samples.tokens",
    ),
    Var(
        "SAMPLE_INTERVAL",
        None,
        positive_int,
        "steps between sample answers; default: VALIDATION_INTERVAL with VALIDATION, else only step 0 and the last",
        flag="--samples.every",
    ),
    Var(
        "WANDB_MODE",
        None,
        text("a mode wandb accepts, e.g. offline"),
        "Weights & Biases beside TensorBoard: on with WANDB_API_KEY or WANDB_MODE=offline",
        flag="--metrics.enable_wandb",
    ),
    Var(
        "WANDB_API_KEY",
        None,
        text("a key"),
        "Weights & Biases key; never printed",
        flag="--metrics.enable_wandb",
        secret=True,
    ),
    Var(
        "ASSETS_DIR",
        "./assets/hf",
        path,
        "full scale: the model's assets in `$ASSETS_DIR/<repo name>`, fetched from the Hub when missing",
        "paths",
        flag="--hf_assets_path",
    ),
    Var("OUTPUT_DIR", "./outputs", path, "logs, traces, the run report", "paths", flag="--dump_folder"),
    Var(
        "CACHE_DIR",
        "./cache",
        path,
        "compile caches, per variant (`<variant>/{neff,hlo,nki}` on Neuron, "
        "`<variant>/inductor` elsewhere): mount it to keep them",
        "paths",
    ),
    Var(
        "CHECKPOINT_DIR",
        None,
        path,
        "checkpoints (`step-N/`), shared by every node: save every "
        "CHECKPOINT_INTERVAL steps, resume from the newest complete one",
        "paths",
        flag="--checkpoint.enable --checkpoint.folder",
    ),
    Var(
        "NEURON_LOGICAL_NC_CONFIG",
        "2",
        lnc,
        "physical NeuronCores per logical core: 2 -> 4 per trn2 device, 1 -> 8",
        flag="--neuron.logical_nc_config",
    ),
    Var("NEURON_RT_VISIBLE_CORES", None, core_list, "logical NeuronCores to use; default all"),
    Var("CUDA_VISIBLE_DEVICES", None, comma_list, "GPUs to use; empty: none"),
    Var(
        "HF_TOKEN",
        None,
        text("a token"),
        "Hub token for gated downloads: for the asset "
        "fetch only (not torchrun or the workers), whitespace stripped; never printed",
        secret=True,
    ),
    Var("HF_HUB_OFFLINE", "0", switch, "never download; full-scale assets missing is then an error"),
    Var(
        "NEURON_QWEN3_MOE_KERNEL",
        "auto",
        choice("auto", "nki", "reference"),
        "nki_moe expert kernel: `auto` is NKI on Neuron, the PyTorch reference elsewhere",
        flag="--neuron.moe_kernel",
    ),
    Var(
        "NEURON_QWEN3_ATTENTION_KERNEL",
        "auto",
        choice("auto", "nki", "reference"),
        "attention: `auto` is the NKI kernels on Neuron and flex attention elsewhere; `reference` is their "
        "PyTorch maths on any device",
        flag="--neuron.attention_kernel",
    ),
    # ---- multi-node: plain variables win over an engine's, field by field
    Var("NNODES", None, positive_int, "nodes in the job; default PET_NNODES, SLURM_NNODES, else 1", "rendezvous"),
    Var(
        "NODE_RANK",
        None,
        non_negative_int,
        "this node's rank, 0 hosts the rendezvous; default PET_NODE_RANK, SLURM_NODEID, else 0",
        "rendezvous",
    ),
    Var(
        "MASTER_ADDR",
        None,
        host,
        "rendezvous host (node rank 0); default PET_MASTER_ADDR, the first host of SLURM_JOB_NODELIST",
        "rendezvous",
    ),
    Var("MASTER_PORT", None, port, "rendezvous port; default PET_MASTER_PORT, else 29500", "rendezvous"),
    Var(
        "RDZV_ID",
        None,
        word,
        "rendezvous id, the same on every node; default SLURM_JOB_ID, else a hash of the node count and endpoint",
        "rendezvous",
    ),
    Var(
        "RDZV_TIMEOUT",
        "600",
        seconds,
        "how long the nodes wait for each other at the start and after a worker "
        "failure (c10d `join_timeout`, `read_timeout`)",
        "rendezvous",
    ),
    Var(
        "LOCAL_ADDR",
        None,
        host,
        "this node's address for its peers (torchrun `--local-addr`, e.g. the pod IP); "
        "default: torchrun's guess; one node uses 127.0.0.1",
        "rendezvous",
    ),
    Var("PET_NNODES", None, positive_int, "set by Kubeflow Trainer: nodes", "kubeflow"),
    Var("PET_NODE_RANK", None, non_negative_int, "set by Kubeflow Trainer: this node's rank", "kubeflow"),
    Var("PET_MASTER_ADDR", None, host, "set by Kubeflow Trainer: node 0's address", "kubeflow"),
    Var("PET_MASTER_PORT", None, port, "set by Kubeflow Trainer: rendezvous port", "kubeflow"),
    Var(
        "PET_NPROC_PER_NODE",
        None,
        procs_per_node,
        "set by Kubeflow Trainer: processes per node (`auto`: every core found)",
        "kubeflow",
    ),
    Var("SLURM_NNODES", None, positive_int, "set by Slurm: nodes in the allocation", "slurm"),
    Var("SLURM_NODEID", None, non_negative_int, "set by Slurm: this node's index", "slurm"),
    Var("SLURM_JOB_NODELIST", None, node_list, "set by Slurm: the hosts; the first hosts the rendezvous", "slurm"),
    Var("SLURM_JOB_ID", None, word, "set by Slurm: the job id, the rendezvous id", "slurm"),
    # ---- faults and stops
    Var(
        "CHECKPOINT_INTERVAL", "100", positive_int, "steps between checkpoints", "faults", flag="--checkpoint.interval"
    ),
    Var(
        "CHECKPOINT_KEEP",
        "3",
        keep_count,
        "checkpoints kept, newest first; 0 keeps all",
        "faults",
        flag="--checkpoint.keep_latest_k",
    ),
    Var(
        "MAX_RESTARTS",
        "0",
        non_negative_int,
        "torchrun `--max-restarts`: worker failures survived in place, each resuming from the newest checkpoint",
        "faults",
    ),
    Var(
        "PEER_TIMEOUT",
        "100",
        seconds,
        "once training runs, how long a silent peer is waited for: by every "
        "collective and, on every node but 0, by the launcher for the rendezvous host",
        "faults",
        flag="--comm.train_timeout_seconds",
    ),
    Var(
        "NAN_POLICY",
        "stop",
        choice("stop", "warn"),
        "a NaN or infinite loss stops the run before its step is "
        "saved (worker exit 3); a loss jump above its recent median + 10 x spread too, unless `warn`",
        "faults",
        flag="--divergence.policy",
    ),
    Var(
        "STOP_GRACE",
        "20",
        seconds,
        "after SIGTERM/SIGINT, seconds before everything the launcher started is "
        "SIGKILLed: the step in flight and the save on stop must fit",
        "faults",
    ),
    # ---- preflight
    Var(
        "PREFLIGHT",
        "strict",
        choice("strict", "warn"),
        "strict: a failed check stops the launch (exit 2); warn: it is printed",
        "preflight",
    ),
    Var(
        "NEURON_CC_FLAGS",
        None,
        shell_words,
        "Neuron compiler flags; its `--lnc` must equal NEURON_LOGICAL_NC_CONFIG",
        "preflight",
    ),
)
SECRETS = tuple(var.name for var in VARS if var.secret)


# The parsed environment: one field per Var, named in lower case, typed by its parser's return type.
Settings = make_dataclass(
    "Settings",
    [
        (var.name.lower(), typing.get_type_hints(var.parse).get("return", str) | None, field(repr=not var.secret))
        for var in VARS
    ],
    frozen=True,
)


def parse(env) -> "Settings":
    values = {}
    for var in VARS:
        raw = env.get(var.name, var.default)
        try:
            values[var.name.lower()] = None if raw is None else var.parse(raw)
        except (ValueError, KeyError):
            raise UsageError(f"{var.name}={raw!r} is not {var.allowed}") from None
    return Settings(**values)
