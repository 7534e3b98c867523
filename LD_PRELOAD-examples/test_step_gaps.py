"""Tests of step_gaps.py on synthetic traces: standard library only, no torch, no GPU.

    cd LD_PRELOAD-examples && python3 -m unittest -v test_step_gaps

(ctest runs it as examples.step_gaps.)
"""

import unittest

import exposed_comm
import step_gaps

CPU, GPU0 = 1, 0
COMPUTE, AG = 7, 33


def ev(cat, name, ts, dur, tid, corr=None, pid=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}
    if pid is not None:
        e["pid"] = pid
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def launch(ts, corr):
    return ev("cuda_runtime", "cudaLaunchKernel", ts, 3, CPU, corr)


def gemm(ts, dur, corr):
    return ev("kernel", "gemm", ts, dur, COMPUTE, corr, GPU0)


class Gaps(unittest.TestCase):
    def trace(self):
        """One step: a GEMM, a 300 us gap while the CPU is in the all-gather call and launches
        the next GEMM only then (host), a GEMM, then a gap the next GEMM (launched early) spends
        waiting for a peer copy on another stream (wait)."""
        return [
            ev("user_annotation", exposed_comm.STEP_MARKER, 0, 2000, CPU),
            launch(5, 1), gemm(10, 100, 1),
            ev("cpu_op", "nccl:_all_gather_base", 100, 300, CPU),
            launch(405, 2), gemm(410, 100, 2),
            launch(420, 3),
            ev("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 500, 200, AG, 9, GPU0),
            gemm(720, 100, 3),
        ]

    def test_a_gap_the_cpu_caused_is_charged_to_its_cpu_op(self):
        r = step_gaps.analyze(self.trace())
        self.assertEqual(r["steps"], 1)
        self.assertEqual(r["compute_stream"], (GPU0, COMPUTE))
        self.assertAlmostEqual(r["host_us"], 300)
        self.assertAlmostEqual(r["host"]["nccl:_all_gather_base"], 290)
        self.assertAlmostEqual(r["host"]["(no CPU op)"], 10)

    def test_a_gap_waiting_for_another_stream_is_charged_to_what_ended_last(self):
        r = step_gaps.analyze(self.trace())
        self.assertAlmostEqual(r["wait_us"], 210)
        self.assertEqual(list(r["waited"]), ["allgather: Memcpy PtoP (Device -> Device)"])
        self.assertEqual(r["cpu_ops"], {"nccl:_all_gather_base": [300.0]})

    def test_short_gaps_and_gaps_outside_the_steps_are_left_out(self):
        t = self.trace()
        t[0]["dur"] = 600  # the step ends before the wait
        t.append(gemm(830, 10, 4))  # 10 us after the last GEMM: below MIN_GAP_US
        r = step_gaps.analyze(t)
        self.assertAlmostEqual(r["wait_us"], 0)
        self.assertAlmostEqual(r["host_us"], 300)


if __name__ == "__main__":
    unittest.main()
