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


def stats_file(directory, pid, comms, ce_calls, each, later, rs=None):
    """One process's ZEROCTA_STATS JSON, as src/core/stats.cc writes it (the fields read here);
    rs: {route: calls} of its reduce-scatters."""
    s = {"version": "0.1.0", "pid": pid, "comms_created": comms, "comms_zero_policy": comms,
         "comms_ce_ready": comms,
         "route": {"pairs_each_pushes": each, "pairs_later_does_both": later},
         "ops": {"allgather": {"ce": {"calls": ce_calls, "bytes": ce_calls << 20}}}}
    if rs:
        s["ops"]["reducescatter"] = {r: {"calls": c, "bytes": c << 21} for r, c in rs.items()}
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

    def test_reduce_scatter_routes_are_reported_when_counted(self):
        stats_file(self.dir.name, 11, 1, 10, 5, 0, rs={"ce": 6, "passthrough": 2})
        stats_file(self.dir.name, 12, 1, 10, 5, 0, rs={"ce": 6, "passthrough": 2})
        problems, summary, lines = self.compare()
        self.assertEqual(problems, [])
        self.assertIn("zerocta reduce-scatter routes, all ranks: ce 12 calls (0.0 GiB), "
                      "passthrough 4 calls (0.0 GiB)", lines)
        self.assertEqual(summary["reducescatter_routes"]["ce"], {"calls": 12, "bytes": 12 << 21})

    def test_no_reduce_scatter_no_line(self):
        stats_file(self.dir.name, 11, 1, 10, 5, 0)
        stats_file(self.dir.name, 12, 1, 10, 5, 0)
        problems, summary, lines = self.compare()
        self.assertFalse(any("reduce-scatter" in line for line in lines))
        self.assertEqual(summary["reducescatter_routes"], {})

    def test_reduce_scatter_routes_from_the_record(self):
        rec = record([{"counters": {"allgather/ce": {"calls": 3, "bytes": 3},
                                    "reducescatter/ce": {"calls": 2, "bytes": 2}},
                       "comms_created": 1}] * 2)
        _, summary, lines = compare_runs.compare(record(None), rec, second_plain=False,
                                                 stats_dir=None)
        self.assertEqual(summary["reducescatter_routes"]["ce"]["calls"], 4)
        self.assertEqual(summary["allgather_routes"]["ce"]["calls"], 6)


class FirstRunUnderZerocta(unittest.TestCase):
    """run_pair.sh PAIR_BASE=allgather-only: both runs under zerocta, other routes."""

    def setUp(self):
        self.dirs = [tempfile.TemporaryDirectory() for _ in range(2)]
        for d in self.dirs:
            self.addCleanup(d.cleanup)
        first, second = (d.name for d in self.dirs)
        for pid in (11, 12):
            stats_file(first, pid, 1, 10, 5, 0, rs={"passthrough": 4})
            stats_file(second, pid + 10, 1, 10, 5, 0, rs={"ce": 4})

    def compare(self, first_rec, other_rec=None):
        return compare_runs.compare(first_rec, other_rec or record([]), second_plain=False,
                                    stats_dir=self.dirs[1].name, first_zerocta=True,
                                    first_stats_dir=self.dirs[0].name,
                                    names=("zerocta ag=auto rs=nccl", "zerocta ag=auto rs=auto"))

    def test_both_runs_routes_and_names(self):
        fast = record([])
        fast["timing"] = {"median_step_ms": 9.0, "timed_steps": 2}
        problems, summary, lines = self.compare(record([]), fast)
        self.assertEqual(problems, [])
        self.assertIn("median step: zerocta ag=auto rs=nccl 10.00 ms, zerocta ag=auto rs=auto "
                      "9.00 ms, ratio 0.900 (2 timed steps, slowest rank per step)", lines)
        self.assertIn("zerocta reduce-scatter routes of zerocta ag=auto rs=nccl, all ranks: "
                      "passthrough 8 calls (0.0 GiB)", lines)
        self.assertIn("zerocta reduce-scatter routes of zerocta ag=auto rs=auto, all ranks: "
                      "ce 8 calls (0.0 GiB)", lines)
        self.assertEqual(summary["first_routes"]["reducescatter_routes"]["passthrough"]["calls"],
                         8)
        self.assertEqual(summary["reducescatter_routes"]["ce"]["calls"], 8)
        self.assertEqual(summary["names"], ["zerocta ag=auto rs=nccl", "zerocta ag=auto rs=auto"])
        self.assertAlmostEqual(summary["ratio"], 0.9)

    def test_losses_and_weights_are_still_compared_bitwise(self):
        other = record([])
        other["losses_hex"] = [["3f800000", "3f800001", "3f800000", "3f800000"]] * 2
        other["checksum"] = ["a", "c"]
        problems, summary, _ = self.compare(record([]), other)
        self.assertIn("losses differ", problems)
        self.assertIn("final weights differ", problems)
        self.assertEqual(summary["first_difference"]["step"], 1)

    def test_a_first_run_without_zerocta_is_a_problem(self):
        problems, _, _ = self.compare(record(None))
        self.assertIn("zerocta was not loaded in the first run (zerocta ag=auto rs=nccl)",
                      problems)

    def test_a_missing_rank_of_the_first_run_is_a_problem(self):
        os.remove(os.path.join(self.dirs[0].name, "zerocta-stats-12.json"))
        problems, _, _ = self.compare(record([]))
        self.assertTrue(any(p.startswith("ZEROCTA_STATS files of 1 processes") for p in problems))


if __name__ == "__main__":
    unittest.main()
