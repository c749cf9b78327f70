"""What the training data gave, summed over the data-parallel ranks at every logging step, for summary.json's
`data`: records, turns and tokens read (trained, masked, padding, cut), a mix's by source, and the token cache
(hit on every rank; the slowest rank's preparation: key, open, and any build or wait; and the build's own time,
in whichever run or pre-launch pass built it).

Every rank reads its own share, so the sums are collectives on torchtitan's loss group (data and context
parallel; context-parallel ranks read the same windows, so their sums are divided by that degree). They run
where every rank runs them: in the trainer's logged step (trainer.py), as the MoE router watch's do.
"""

from neuron_qwen3.interval import IntervalSums

SUMMED = ("records", "turns", "tokens_trained", "tokens_masked", "tokens_padding", "truncated", "split", "tokens_cut")


class DataRead:
    def __init__(self, loader, group, cp: int, device):
        self.loader, self.group, self.cp, self.device = loader, group, cp, device
        self.last = None

    def gather(self) -> dict:
        """This interval's totals over the ranks (every rank: collectives), kept as `last` for summary.json."""
        stats = self.loader.stats()
        sources = stats.get("sources") or {}
        cache = stats.get("cache")
        figures = IntervalSums(self.group, self.device)
        figures.add(**{key: stats[key] for key in SUMMED})
        figures.add(**{f"sources/{name}/{key}": n for name, counts in sources.items() for key, n in counts.items()})
        figures.add(  # the slowest rank's, or whether any rank missed the cache
            across="max",
            epoch=stats["epoch"],
            cache_missed=0 if cache is None or cache["hit"] else 1,
            prepare_ms=round(cache["prepare_s"] * 1000) if cache else 0,
            built_ms=round(cache["built_s"] * 1000) if cache and cache["built_s"] is not None else -1,
        )
        totals = {name: int(value) for name, value in figures.reduced().items()}
        found = {"kind": stats["kind"], "epoch": totals["epoch"], **{key: totals[key] // self.cp for key in SUMMED}}
        if sources:
            found["sources"] = {
                name: {key: totals[f"sources/{name}/{key}"] // self.cp for key in counts}
                for name, counts in sources.items()
            }
        if cache is not None:
            found["cache"] = {
                "hit": totals["cache_missed"] == 0,
                "prepare_s": totals["prepare_ms"] / 1000,
                "built_s": totals["built_ms"] / 1000 if totals["built_ms"] >= 0 else None,
                "folder": cache["folder"],
            }
        self.last = found
        return found
