"""The generator, a KV cache at fixed shapes over the model being trained: `plan.py` (slots, prompt-length buckets,
the cache's length), `cache.py` (the cache and the attention that reads it), `sampling.py` (greedy and filtered
draws, each token's log-probability), `engine.py` (prefill and decode in waves, on every rank), `__main__.py` (the
offline command over an exported model folder or a checkpoint)."""
