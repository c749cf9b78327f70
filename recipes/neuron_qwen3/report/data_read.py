"""What the training data gave, summed over the data-parallel ranks at every logging step, for summary.json's
`data`: records, turns and tokens read (trained, masked, padding, cut), a mix's by source, and the token cache
(hit on every rank; the slowest rank's preparation: key, open, and any build or wait; and the build's own time,
in whichever run or pre-launch pass built it).

Every rank reads its own share, so the sums are collectives on torchtitan's loss group (data and context
parallel; context-parallel ranks read the same windows, so their sums are divided by that degree). They run
where every rank runs them: in the trainer's logged step (trainer.py), as the MoE router watch's do.
"""

import torch
import torch.distributed as dist

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
        summed = [stats[key] for key in SUMMED] + [n for s in sources.values() for n in s.values()]
        most = [
            stats["epoch"],
            0 if cache is None or cache["hit"] else 1,
            round(cache["prepare_s"] * 1000) if cache else 0,
            round(cache["built_s"] * 1000) if cache and cache["built_s"] is not None else -1,
        ]
        summed, most = (torch.tensor(values, dtype=torch.int64, device=self.device) for values in (summed, most))
        if self.group is not None:
            dist.all_reduce(summed, group=self.group)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        summed, most = (summed // self.cp).tolist(), most.tolist()
        found = {"kind": stats["kind"], "epoch": most[0], **dict(zip(SUMMED, summed))}
        rest = iter(summed[len(SUMMED) :])
        if sources:
            found["sources"] = {name: {key: next(rest) for key in counts} for name, counts in sources.items()}
        if cache is not None:
            found["cache"] = {
                "hit": most[1] == 0,
                "prepare_s": most[2] / 1000,
                "built_s": most[3] / 1000 if most[3] >= 0 else None,
                "folder": cache["folder"],
            }
        self.last = found
        return found
