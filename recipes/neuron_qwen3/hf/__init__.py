"""Hugging Face weights in and out: `weights.py` (the trainer's hooks), `load.py` (INIT_FROM, every rank its own
rows), `shards.py` (the Hub's sharded layout, planned from the shapes), `write.py` (the streamed export),
`fetch.py` (the asset child: Hub downloads and their checks), `rope.py` (a folder's RoPE, which the run
trains)."""
