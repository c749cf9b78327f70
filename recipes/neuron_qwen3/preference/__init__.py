"""Preference training (METHOD=dpo): `dpo.py` (the loss and its metrics on packed windows), `reference.py` (the
reference model's log-probabilities), `method.py` (both built for a trainer, training and held-out). The pairs
themselves are data: data/pairs.py."""
