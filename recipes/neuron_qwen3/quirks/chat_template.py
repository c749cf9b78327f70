"""torchtitan 0.3.0's tokenizer compiles the chat template with plain Jinja, which fails on `{% generation %}`.

`BaseTokenizer.set_chat_template` (torchtitan/components/tokenizer.py), called by HuggingFaceTokenizer's
constructor for the folder's chat_template.jinja or tokenizer_config.json's chat_template, builds a sandboxed Jinja
environment with only the loopcontrols extension. Templates made for assistant-only loss mark the assistant's
tokens with `{% generation %}...{% endgeneration %}` (TRL's `*_training.jinja`, which a TRL fine-tune saves with
the model; some model repositories ship such templates), a tag plain Jinja does not know: every worker then died
in the tokenizer's constructor. The project renders templates itself with transformers' renderer (data/tokens.py),
which supports the tag; torchtitan's compiled template is never rendered. `apply` makes torchtitan compile with
transformers' own compiler (the same sandbox, globals and filters, plus the tag), so any template transformers
renders loads.
"""

from torchtitan.components.tokenizer import BaseTokenizer


def _set_chat_template(self, template: str) -> None:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    self._chat_template = _compile_jinja_template(template)


def apply() -> None:
    """Once per process, before any tokenizer is built (data/tokens.py imports it)."""
    BaseTokenizer.set_chat_template = _set_chat_template
