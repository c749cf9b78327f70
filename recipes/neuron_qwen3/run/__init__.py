"""The run's guards: `stop.py` (save on SIGTERM), `teardown.py` (process groups at exit), `divergence.py` (a NaN or
spiking loss), `same_config.py` (every rank the same config), `tuning.py` (fine-tuning LR and warm-up, the batch)."""
