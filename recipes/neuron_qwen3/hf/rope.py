"""The RoPE a Hugging Face model folder defines, as transformers reads its config.json.

Qwen publishes config.json in transformers 4's form (`rope_theta`, `rope_scaling`); transformers 5 saves
`rope_parameters`. transformers' own config class reads either (and fills in its default theta where neither says),
so the RoPE is taken from it: the run then trains the model that `from_pretrained` serves. Only the default
(unscaled) RoPE is reproduced by the trained models yet: a scaled one (YaRN, linear, dynamic...) is refused in one
line naming the field, instead of training another model than the folder's.
"""

import json
import os
from dataclasses import dataclass


class RopeError(ValueError):
    """A folder's RoPE that the run cannot reproduce: one line naming the field."""


@dataclass(frozen=True)
class Rope:
    theta: float
    positions: int  # max_position_embeddings

    def describe(self) -> str:
        return f"theta {self.theta:,.0f}, {self.positions:,} positions"


def of_folder(folder: str, where: str) -> Rope | None:
    """The RoPE of `folder`'s config.json (`where`: how a refusal names it); None when transformers cannot read
    one there (the pre-launch pass names a missing or broken folder in its own line)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError):
        return None
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type", "default")
    if kind != "default":
        with open(os.path.join(folder, "config.json")) as f:
            field = "rope_parameters" if "rope_parameters" in json.load(f) else "rope_scaling"
        raise RopeError(
            f"{where}={folder!r}: config.json's {field} has rope_type={kind!r}, which this project does not "
            "train yet (allowed: rope_type 'default')"
        )
    return Rope(float(parameters["rope_theta"]), int(config.max_position_embeddings))
