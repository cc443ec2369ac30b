"""Reading a benchmark run's results (target/bench/results-*.json, or a run
docs/benchmarks.md cites, copied into docs/benchmarks/), shared by the summaries
of bench.sh and bench.sh --wan."""
import json


class Results:
    """One run's figures, looked up by dotted keys ("wan_fs.seq_write_mib_s")."""

    def __init__(self, path):
        self.r = json.load(open(path))

    def get(self, key):
        """The figure at `key`, or None if the run did not produce it."""
        node = self.r
        for p in key.split("."):
            if not isinstance(node, dict) or p not in node:
                return None
            node = node[p]
        return node

    def g(self, key):
        """The figure at `key` as a number, 0 when missing."""
        return float(self.get(key) or 0)

    def missing(self, expected):
        """The keys of `expected` that hold no number."""
        return [k for k in expected if not isinstance(self.get(k), (int, float))]
