"""Tests of compare_runs.py's report from a zerocta run's ZEROCTA_STATS files (routes and how
the route's pairs were settled), on files written here in src/core/stats.cc's format: standard
library only, no torch, no GPU.

    cd LD_PRELOAD-examples && python3 -m unittest -v test_compare_runs

(ctest runs it as examples.compare_runs.)
"""

import json
import os
import tempfile
import unittest

import compare_runs


def record(zerocta):
    """The fields of a training record that compare_runs.py reads, two ranks."""
    return {"script": "fsdp2_gpt", "name": "comm", "world_size": 2, "steps": 4,
            "losses_hex": [["3f800000"] * 4] * 2, "checksum": ["a", "b"], "finite": True,
            "timing": {"median_step_ms": 10.0, "timed_steps": 2}, "zerocta": zerocta,
            "profile": None}


def stats_file(directory, pid, comms, ce_calls, each, later):
    """One process's ZEROCTA_STATS JSON, as src/core/stats.cc writes it (the fields read here)."""
    s = {"version": "0.1.0", "pid": pid, "comms_created": comms, "comms_zero_policy": comms,
         "comms_ce_ready": comms,
         "route": {"pairs_each_pushes": each, "pairs_later_does_both": later},
         "ops": {"allgather": {"ce": {"calls": ce_calls, "bytes": ce_calls << 20}}}}
    with open(os.path.join(directory, "zerocta-stats-%d.json" % pid), "w") as f:
        json.dump(s, f)


class StatsReport(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def compare(self):
        return compare_runs.compare(record(None), record([]), second_plain=False,
                                    stats_dir=self.dir.name)

    def test_pairs_that_fell_back_are_counted_per_process(self):
        stats_file(self.dir.name, 11, 1, 1020, 699, 9)
        stats_file(self.dir.name, 12, 1, 1020, 306, 6)
        problems, summary, lines = self.compare()
        self.assertEqual(problems, [])
        self.assertIn("zerocta pairs across processes: each pushes 1005, later does both 15 "
                      "(1.5 %; per process 9, 6)", lines)
        self.assertEqual(summary["pairs"], {"each_pushes": [699, 306],
                                            "later_does_both": [9, 6]})
        self.assertEqual(summary["allgather_routes"]["ce"]["calls"], 2040)

    def test_a_forked_process_without_a_communicator_is_not_a_rank(self):
        stats_file(self.dir.name, 11, 1, 10, 5, 0)
        stats_file(self.dir.name, 12, 1, 10, 5, 0)
        stats_file(self.dir.name, 13, 0, 0, 0, 0)  # a DataLoader worker's file of zeros
        problems, summary, lines = self.compare()
        self.assertEqual(problems, [])
        self.assertEqual(summary["pairs"]["later_does_both"], [0, 0])
        self.assertIn("zerocta pairs across processes: each pushes 10, later does both 0 "
                      "(0.0 %; per process 0, 0)", lines)

    def test_no_pair_settled(self):
        stats_file(self.dir.name, 11, 1, 0, 0, 0)
        stats_file(self.dir.name, 12, 1, 0, 0, 0)
        self.assertIn("zerocta pairs across processes: none settled", self.compare()[2])

    def test_no_stats_dir_no_pairs(self):
        _, summary, lines = compare_runs.compare(record(None), record([]), second_plain=False,
                                                 stats_dir=None)
        self.assertNotIn("pairs", summary)
        self.assertFalse(any(line.startswith("zerocta pairs") for line in lines))


if __name__ == "__main__":
    unittest.main()
