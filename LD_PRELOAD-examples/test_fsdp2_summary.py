"""fsdp2_summary.py on made-up pair directories: ratios per configuration in run order, their
median and largest, a failed pair counted as not matching."""

import json
import os
import tempfile
import unittest

import fsdp2_summary


class Fsdp2SummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def pair(self, name, summary):
        d = os.path.join(self.dir.name, name)
        os.makedirs(d)
        path = os.path.join(d, "summary.json")
        if summary is not None:
            with open(path, "w") as f:
                json.dump(summary, f)
        return path

    def test_pairs_of_a_configuration_give_median_and_largest_in_run_order(self):
        paths = [self.pair("fsdp2-comm-p1", {"match": True, "ratio": 0.95}),
                 self.pair("fsdp2-host-bound-p1", {"match": True, "ratio": 1.02}),
                 self.pair("fsdp2-comm-p2", {"match": True, "ratio": 0.99}),
                 self.pair("fsdp2-comm-p3", {"match": True, "ratio": 0.93})]
        s = fsdp2_summary.summarize(paths)
        self.assertEqual(s["configs"]["fsdp2-comm"]["ratios"], [0.95, 0.99, 0.93])
        self.assertAlmostEqual(s["configs"]["fsdp2-comm"]["median_ratio"], 0.95)
        self.assertAlmostEqual(s["configs"]["fsdp2-comm"]["max_ratio"], 0.99)
        self.assertEqual(s["configs"]["fsdp2-host-bound"]["pairs"], 1)
        self.assertTrue(s["all_match"])
        self.assertIn("median 0.950, largest 0.990, bitwise in every pair",
                      fsdp2_summary.line("fsdp2-comm", s["configs"]["fsdp2-comm"]))

    def test_a_failed_or_mismatched_pair_makes_the_sweep_not_match(self):
        paths = [self.pair("fsdp2-tiny-p1", {"match": True, "ratio": 1.0}),
                 self.pair("fsdp2-tiny-p2", None)]
        s = fsdp2_summary.summarize(paths)
        self.assertFalse(s["all_match"])
        self.assertFalse(s["configs"]["fsdp2-tiny"]["all_match"])
        self.assertEqual(s["configs"]["fsdp2-tiny"]["ratios"], [1.0, None])
        self.assertEqual(s["pairs"]["fsdp2-tiny-p2"]["problems"], ["run failed"])

    def test_a_single_pair_keeps_its_plain_name(self):
        s = fsdp2_summary.summarize([self.pair("fsdp2-comm", {"match": True, "ratio": None})])
        self.assertEqual(list(s["configs"]), ["fsdp2-comm"])
        self.assertIsNone(s["configs"]["fsdp2-comm"]["median_ratio"])

    def test_what_was_compared_is_kept_and_printed(self):
        paths = [self.pair("fsdp2-comm-p1", {"match": True, "ratio": 0.97}),
                 self.pair("fsdp2-comm-p2", {"match": True, "ratio": 0.95})]
        compared = "zerocta ag=auto rs=auto vs zerocta ag=auto rs=nccl"
        s = fsdp2_summary.summarize(paths, compared)
        self.assertEqual(s["compared"], compared)
        self.assertIn("step-time ratio (%s) median 0.960, largest 0.970" % compared,
                      fsdp2_summary.line("fsdp2-comm", s["configs"]["fsdp2-comm"], compared))
        out = os.path.join(self.dir.name, "sweep.json")
        self.assertEqual(fsdp2_summary.main(["fsdp2_summary.py", "--compared", compared, out]
                                            + paths), 0)
        with open(out) as f:
            self.assertEqual(json.load(f)["compared"], compared)
        self.assertEqual(fsdp2_summary.main(["fsdp2_summary.py", out] + paths), 0)
        with open(out) as f:
            self.assertIsNone(json.load(f)["compared"])
        self.assertEqual(fsdp2_summary.main(["fsdp2_summary.py", "--compared"]), 2)


if __name__ == "__main__":
    unittest.main()
