"""The generator's shapes, decided before it runs: slots, the prompt-length buckets, the cache length.

On Trainium each new input shape is a compilation of minutes, so a generator there runs a handful of graphs: one
prefill per bucket, [slots, bucket], and one decode step, [slots, 1], over a cache of `length` positions. A
prompt is padded to the smallest bucket that holds it.
"""

from dataclasses import dataclass

from neuron_qwen3.shapes import STATE_SHARE

MOST_BUCKETS = 4
SMALLEST_BUCKET = 16
QUERY_BLOCK = 256  # the queries of a pass the cache attention scores at once (generate/cache.py)


@dataclass(frozen=True)
class Plan:
    slots: int
    buckets: tuple[int, ...]  # ascending prompt lengths a prefill pads to
    new_tokens: int  # the most tokens an answer takes
    query_block: int = QUERY_BLOCK  # a prefill's queries scored at once: its scores grow as bucket x block

    def __post_init__(self):
        assert self.slots >= 1 and self.new_tokens >= 1 and self.query_block >= 1 and self.buckets, self
        assert list(self.buckets) == sorted(set(self.buckets)), f"buckets not ascending: {self.buckets}"

    @property
    def length(self) -> int:
        """The cache's positions: the longest prompt and its answer."""
        return self.buckets[-1] + self.new_tokens

    def bucket(self, prompt_tokens: int) -> int:
        fits = [b for b in self.buckets if b >= prompt_tokens]
        if not fits:
            raise ValueError(f"a prompt of {prompt_tokens} tokens is over the largest bucket, {self.buckets[-1]}")
        return fits[0]

    def shapes(self) -> list[tuple[str, tuple[int, int]]]:
        """Every input shape the generator runs: the prefills, then the decode step."""
        return [*(("prefill", (self.slots, b)) for b in self.buckets), ("decode", (self.slots, 1))]

    def cache_bytes(self, layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
        return 2 * layers * self.slots * kv_heads * self.length * head_dim * itemsize

    def prefill_bytes(self, heads: int, mlp_width: int, itemsize: int) -> int:
        """A prefill of the largest bucket's peak beside the weights and the cache: the cache attention's float32
        scores and probabilities of one block of queries, or the MLP's three intermediates (its gate, up and their
        product), whichever is more."""
        bucket = self.buckets[-1]
        scores = 2 * self.slots * min(bucket, self.query_block) * heads * bucket * 4
        return max(scores, 3 * self.slots * bucket * mlp_width * itemsize)


def buckets_for(lengths: list[int], room: int, most: int = MOST_BUCKETS, smallest: int = SMALLEST_BUCKET) -> tuple:
    """Up to `most` bucket sizes for prompts of `lengths` tokens: powers of two from `smallest`, the last one capped
    at `room` (the most prompt tokens the cache leaves); the smallest ones merge into the next when there are more."""
    assert lengths and max(lengths) <= room, f"a prompt of {max(lengths)} tokens is over the room, {room}"
    sizes = sorted({min(room, max(smallest, 1 << (n - 1).bit_length())) for n in lengths})
    return tuple(sizes[-most:])


def gathers_once(weight_bytes: int, block_bytes: int, working_bytes: int, memory_gib: float | None) -> tuple:
    """(whether, the bytes it takes, one line saying why) a round keeps each FSDP unit's weights gathered from its
    first forward pass to the round's end (quirks/fsdp_round.py) instead of gathering them at every forward pass.
    It then holds the whole model's weights on every rank, and while a block is gathered FSDP's all-gather holds
    about two more of it (measured on the simulated device: bench/RESULTS.md). That, the KV cache and a prefill's
    activations (`working_bytes`) must fit in what FSDP's sharded state leaves of a rank's memory, which training
    fills with activations and generation does not. `memory_gib` None: not budgeted (CPU's host memory)."""
    need = weight_bytes + 2 * block_bytes + working_bytes
    sizes = (
        f"{size(need)} (the whole model's weights {size(weight_bytes)}, a block's all-gather "
        f"{size(2 * block_bytes)}, the KV cache and a prefill {size(working_bytes)})"
    )
    if memory_gib is None:
        return True, need, f"weights gathered once a round: {sizes}"
    room = (1 - STATE_SHARE) * memory_gib
    if need <= room * 2**30:
        return True, need, f"weights gathered once a round: {sizes}, within {1 - STATE_SHARE:.0%} of {memory_gib:g} GiB"
    return (
        False,
        need,
        (
            f"weights gathered at every forward pass: gathering them once a round would take {sizes}, over "
            f"{1 - STATE_SHARE:.0%} of the {memory_gib:g} GiB of a rank"
        ),
    )


def size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
