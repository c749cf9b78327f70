"""What crosses the process boundary: variables that look meant for the launcher but are not read by it are named
(a typo would otherwise be silently ignored), and secrets reach only the child that needs them and no printed line.
"""

import difflib

from entrypoint.contract import SECRETS, VARS

# Other launchers' variables that this one does not read, and what to use instead.
FOREIGN = {
    "NGPU": "NPROC (processes per node; default: every core or GPU found)",
    "CONFIG_FILE": "VARIANT and SCALE, or MODULE and CONFIG (config functions, not TOML files)",
    "NEURON_RT_NUM_CORES": "NEURON_RT_VISIBLE_CORES (which cores) or NPROC (how many processes)",
    "TRAIN_STEPS": "STEPS",
}
# Set by schedulers and runtimes, never typed by a user: not checked for near misses.
ENGINE_PREFIXES = ("SLURM_", "PET_", "KUBERNETES_", "OMPI_", "PMI_", "TORCHELASTIC_", "NVIDIA_")
# The deploy scripts' own variables, which reach the launcher through srun's environment: not near misses either.
DEPLOY_NAMES = ("NEURON_QWEN3_HOME",)  # deploy/slurm/train.sbatch: the checkout to run


def stray_names(env) -> list:
    """Warnings (one line each) for variables that look meant for this launcher but are not read by it."""
    known = {var.name for var in VARS}
    lines = []
    for name in sorted(env):
        if name in known:
            continue
        if name in FOREIGN:
            lines.append(f"{name} is not read by this launcher: use {FOREIGN[name]}")
        elif not name.startswith(ENGINE_PREFIXES) and name not in DEPLOY_NAMES:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                lines.append(f"{name} is not read by this launcher: did you mean {close[0]}?")
    return lines


def child_env(environ, fetch=False) -> dict:
    """HF_TOKEN goes to the asset fetch alone (stripped: a secret file ends in a newline), no other secret there."""
    env = {name: value for name, value in environ.items() if name not in (SECRETS if fetch else ("HF_TOKEN",))}
    return {**env, "HF_TOKEN": environ["HF_TOKEN"].strip()} if fetch and environ.get("HF_TOKEN") else env


def redact(text: str, env) -> str:
    """Hide every secret of `env` (HF_TOKEN, WANDB_API_KEY) in anything printed: error lines, the plan, the launch
    line. Also each without its surrounding whitespace: a Kubernetes secret made from a file keeps its newline."""
    secrets = {value for name in SECRETS for value in (env.get(name) or "", (env.get(name) or "").strip())} - {""}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
