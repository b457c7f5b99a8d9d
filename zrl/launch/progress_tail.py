"""Reading the learner's LOGDIR/progress.jsonl (zrl.metrics) while the run goes on: each call
gives the records written since the last one, whole lines only."""
from __future__ import annotations

import json
from pathlib import Path


class ProgressTail:
    def __init__(self, path: Path):
        self.path = path
        # A resumed run appends to its earlier records: only this run's are read.
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict]:
        """The records added since the last read (none while the file is not there yet)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # (a torn line from a learner killed mid-write) skipped
                continue
        return records
