"""The launcher's live progress line: `step k/N`, tokens/s and an ETA, now and then.

The workers' rank 0 appends one JSON record per logged step to $OUTPUT_DIR/report/metrics.jsonl
(recipes/neuron_qwen3/report.py); the launcher's polling loop calls `poll`, which reads what is new there and
prints at most one line per interval (10 s on a terminal, 60 s otherwise, so a container log is not flooded),
and only when a step was logged since the last line.
"""

import json
import os
import sys
import time

TTY_INTERVAL, LOG_INTERVAL = 10, 60  # seconds between progress lines


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def line(record: dict) -> str:
    step, total = record["step"], record.get("steps_total")
    text = f"step {step}/{total}" if total else f"step {step}"
    text += f"  {record['tokens_per_s']:,.0f} tokens/s  loss {record['loss']:.4f}"
    if total and record.get("step_time_s"):
        text += f"  ETA {duration((total - step) * record['step_time_s'])}"
    return text


class Progress:
    def __init__(self, path: str, interval: float, stream=None, clock=time.monotonic, since: float | None = None):
        self.path, self.interval, self.stream, self.clock = path, interval, stream or sys.stdout, clock
        self.since = time.time() if since is None else since  # records of earlier runs in the same folder: skip
        self.offset, self.latest, self.printed_at, self.printed_step = 0, None, None, None

    @classmethod
    def for_command(cls, argv, stream=None):
        """The progress of a training command (one with `--dump_folder`); None for any other command."""
        argv, folder = list(argv), None
        for flag, value in zip(argv, [*argv[1:], None]):  # `--dump_folder X` or `--dump_folder=X`; the last wins
            if flag == "--dump_folder" and value is not None:
                folder = value
            elif flag.startswith("--dump_folder="):
                folder = flag.split("=", 1)[1]
        if folder is None:
            return None
        stream = stream or sys.stdout
        interval = TTY_INTERVAL if stream.isatty() else LOG_INTERVAL
        return cls(os.path.join(folder, "report", "metrics.jsonl"), interval, stream)

    def _read(self):
        try:
            with open(self.path) as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # rewritten by a new attempt
                    self.offset = 0
                f.seek(self.offset)
                text = f.read()
        except OSError:
            return
        complete = text[: text.rfind("\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if record.get("time", 0) >= self.since:
                self.latest = record

    def poll(self) -> None:
        now = self.clock()
        if self.printed_at is not None and now - self.printed_at < self.interval:
            return
        self._read()
        if self.latest is None or self.latest["step"] == self.printed_step:
            return
        print(f"entrypoint: {line(self.latest)}", file=self.stream, flush=True)
        self.printed_at, self.printed_step = now, self.latest["step"]
