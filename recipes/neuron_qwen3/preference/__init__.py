"""Preference training (METHOD=dpo): `dpo.py` (the loss and its metrics on packed windows), `reference.py` (the
reference model's log-probabilities), `logps.py` (the labels' log-probabilities a chunk at a time, GRPO's too),
`method.py` (both built for a trainer, training and held-out). The pairs themselves are data: data/pairs.py."""
