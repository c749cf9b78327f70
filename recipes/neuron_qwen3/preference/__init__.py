"""Preference training (METHOD=dpo): `dpo.py` (the loss and its metrics on packed windows), `reference.py` (the
reference model's log-probabilities). The pairs themselves are data: data/pairs.py."""
