"""The generator: a KV cache at fixed shapes, prefill in length buckets, decode, sampling."""
