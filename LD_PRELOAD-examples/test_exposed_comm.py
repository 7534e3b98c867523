"""Tests of exposed_comm.py (the trace analysis) and of compare_runs.py's exposure line, on
synthetic traces: standard library only, no torch, no GPU.

    cd LD_PRELOAD-examples && python3 -m unittest -v test_exposed_comm

(ctest runs it as examples.exposed_comm.)
"""

import json
import os
import random
import tempfile
import unittest

import compare_runs
import exposed_comm
from exposed_comm import GpuEvent

COMPUTE, AG_STREAM, CE_STREAM = (0, 7), (0, 21), (0, 33)
GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>(Params)"
AG_KERNEL = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS_KERNEL = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
PEER_COPY = "Memcpy PtoP (Device -> Device)"
DEVICE_COPY = "Memcpy DtoD (Device -> Device)"


def kernel(name, stream, start, dur):
    return GpuEvent(name, "kernel", stream, float(start), float(dur))


def copy(name, stream, start, dur):
    return GpuEvent(name, "gpu_memcpy", stream, float(start), float(dur))


class Classify(unittest.TestCase):
    def test_nccl_kernels_by_name(self):
        events = [kernel(AG_KERNEL, AG_STREAM, 0, 1),
                  kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*)", AG_STREAM,
                         1, 1),
                  kernel(RS_KERNEL, AG_STREAM, 2, 1),
                  kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", AG_STREAM, 3, 1),
                  kernel("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", AG_STREAM,
                         4, 1),
                  kernel(GEMM, COMPUTE, 5, 1)]
        self.assertEqual(exposed_comm.classify(events),
                         ["allgather", "allgather", "reducescatter", "other_comm", "other_comm",
                          "compute"])

    def test_copies_by_kind_and_stream(self):
        events = [kernel(GEMM, COMPUTE, 0, 1),
                  copy(PEER_COPY, CE_STREAM, 0, 1),
                  copy(DEVICE_COPY, CE_STREAM, 1, 1),
                  copy(DEVICE_COPY, COMPUTE, 2, 1),  # a compute stream's own copy
                  copy("Memcpy HtoD (Pinned -> Device)", CE_STREAM, 3, 1),
                  GpuEvent("Memset (Device)", "gpu_memset", CE_STREAM, 4.0, 1.0)]
        self.assertEqual(exposed_comm.classify(events),
                         ["compute", "allgather", "allgather", "other", "other", "other"])

    def test_nccl_kernels_do_not_make_a_compute_stream(self):
        # The copies share their stream with an NCCL kernel only: still all-gather.
        events = [kernel(AG_KERNEL, CE_STREAM, 0, 1), copy(PEER_COPY, CE_STREAM, 1, 1)]
        self.assertEqual(exposed_comm.classify(events), ["allgather", "allgather"])


    def test_zerocta_reduce_scatter_sums_are_reduce_scatter_not_compute(self):
        # zerocta's summing kernel runs on its own (the all-gather's) streams: it neither counts
        # as compute nor makes the copies beside it a compute stream's.
        events = [kernel(GEMM, COMPUTE, 0, 4),
                  kernel("zc_chunk_sum_f32", CE_STREAM, 1, 1),
                  kernel("zc_chunk_sum_bf16", CE_STREAM, 2, 1),
                  copy(PEER_COPY, CE_STREAM, 3, 1)]
        self.assertEqual(exposed_comm.classify(events),
                         ["compute", "reducescatter", "reducescatter", "allgather"])
        r = exposed_comm.analyze([kernel("zc_chunk_sum_f32", CE_STREAM, 0, 2),
                                  kernel(GEMM, COMPUTE, 1, 3)], [(0, 4)])
        self.assertAlmostEqual(r["reducescatter_us"], 2)
        self.assertAlmostEqual(r["exposed_reducescatter_us"], 1)
        self.assertAlmostEqual(r["compute_us"], 3)


class Analyze(unittest.TestCase):
    def check(self, events, windows, **expected):
        r = exposed_comm.analyze(events, windows)
        for key, value in expected.items():
            self.assertAlmostEqual(r[key], value, places=6, msg=key)
        return r

    def test_allgather_hidden_under_a_kernel(self):
        events = [kernel(GEMM, COMPUTE, 0, 100), copy(PEER_COPY, CE_STREAM, 20, 50)]
        self.check(events, [(0, 100)], window_us=100, allgather_us=50, compute_us=100,
                   exposed_allgather_us=0, exposed_allgather_share=0, idle_us=0)

    def test_allgather_fully_exposed(self):
        events = [kernel(GEMM, COMPUTE, 0, 40), copy(PEER_COPY, CE_STREAM, 50, 50)]
        self.check(events, [(0, 100)], window_us=100, allgather_us=50, compute_us=40,
                   exposed_allgather_us=50, exposed_allgather_share=0.5, idle_us=10)

    def test_partial_overlap(self):
        events = [kernel(GEMM, COMPUTE, 0, 60), kernel(GEMM, COMPUTE, 80, 20),
                  copy(PEER_COPY, CE_STREAM, 40, 50)]  # 40-90: hidden 40-60 and 80-90
        self.check(events, [(0, 100)], allgather_us=50, exposed_allgather_us=20,
                   exposed_allgather_share=0.2, idle_us=0)

    def test_copy_on_the_compute_stream_is_not_allgather(self):
        events = [kernel(GEMM, COMPUTE, 0, 50), copy(DEVICE_COPY, COMPUTE, 50, 50)]
        r = self.check(events, [(0, 100)], allgather_us=0, exposed_allgather_us=0,
                       compute_us=50, idle_us=0)
        self.assertEqual(r["events"], {"compute/kernel": 1, "other/gpu_memcpy": 1})

    def test_overlapping_allgathers_are_a_union(self):
        # Two peers' copies at once and a third later: 10-50 and 60-70, compute 0-20, idle
        # 50-60 and 70-100.
        events = [kernel(GEMM, COMPUTE, 0, 20),
                  copy(PEER_COPY, CE_STREAM, 10, 30), copy(PEER_COPY, (0, 34), 20, 30),
                  copy(DEVICE_COPY, (0, 35), 60, 10)]
        self.check(events, [(0, 100)], allgather_us=50, exposed_allgather_us=40,
                   exposed_allgather_share=0.4, idle_us=40)

    def test_nccl_allgather_kernel(self):
        # NCCL's kernel on its own stream, overlapped by compute for half of it.
        events = [kernel(GEMM, COMPUTE, 0, 30), kernel(AG_KERNEL, AG_STREAM, 10, 40),
                  kernel(RS_KERNEL, AG_STREAM, 60, 20), kernel(GEMM, COMPUTE, 70, 30)]
        r = self.check(events, [(0, 100)], allgather_us=40, exposed_allgather_us=20,
                       reducescatter_us=20, exposed_reducescatter_us=10, compute_us=60,
                       exposed_allgather_share=0.2, idle_us=10)
        self.assertEqual(r["events"], {"allgather/kernel": 1, "compute/kernel": 2,
                                       "reducescatter/kernel": 1})

    def test_windows_clip_and_count(self):
        # Two steps; activity between them (data preparation) is left out.
        events = [kernel(GEMM, COMPUTE, 0, 10), copy(PEER_COPY, CE_STREAM, 5, 10),
                  kernel(GEMM, COMPUTE, 50, 10),  # between the steps
                  kernel(GEMM, COMPUTE, 100, 10), copy(PEER_COPY, CE_STREAM, 110, 10)]
        r = self.check(events, [(0, 15), (100, 120)], window_us=35, allgather_us=20,
                       compute_us=20, exposed_allgather_us=15)
        self.assertEqual(r["steps"], 2)
        self.assertEqual(r["events"], {"allgather/gpu_memcpy": 2, "compute/kernel": 2})

    def test_no_window_is_one_span(self):
        events = [kernel(GEMM, COMPUTE, 10, 10), copy(PEER_COPY, CE_STREAM, 30, 10)]
        self.check(events, None, steps=1, window_us=30, exposed_allgather_us=10, idle_us=10)

    def test_against_a_brute_force_count(self):
        # Integer times: every microsecond's state counted one by one.
        rng = random.Random(1)
        streams = [COMPUTE, (0, 8), AG_STREAM, CE_STREAM]
        names = {COMPUTE: [GEMM], (0, 8): [GEMM, DEVICE_COPY], AG_STREAM: [AG_KERNEL, RS_KERNEL],
                 CE_STREAM: [PEER_COPY]}
        for _ in range(200):
            events = []
            for _ in range(rng.randint(0, 12)):
                stream = rng.choice(streams)
                name = rng.choice(names[stream])
                make = copy if name.startswith("Memcpy") else kernel
                events.append(make(name, stream, rng.randint(0, 90), rng.randint(0, 20)))
            windows = [(5, 40), (50, 95)]
            classes = exposed_comm.classify(events)
            want = dict.fromkeys(("allgather_us", "compute_us", "exposed_allgather_us",
                                  "reducescatter_us", "exposed_reducescatter_us", "idle_us"), 0)
            for t in [t for lo, hi in windows for t in range(lo, hi)]:
                on = {c for e, c in zip(events, classes) if e.start_us <= t < e.start_us + e.dur_us}
                want["allgather_us"] += "allgather" in on
                want["compute_us"] += "compute" in on
                want["reducescatter_us"] += "reducescatter" in on
                want["exposed_allgather_us"] += "allgather" in on and "compute" not in on
                want["exposed_reducescatter_us"] += "reducescatter" in on and "compute" not in on
                want["idle_us"] += not on
            r = exposed_comm.analyze(events, windows)
            self.assertEqual({k: r[k] for k in want}, want, events)

    def test_empty(self):
        r = exposed_comm.analyze([], None)
        self.assertEqual((r["steps"], r["window_us"], r["exposed_allgather_share"]),
                         (0, 0, None))

    def test_combine(self):
        a = exposed_comm.analyze([kernel(GEMM, COMPUTE, 0, 40),
                                  copy(PEER_COPY, CE_STREAM, 50, 50)], [(0, 100)])
        b = exposed_comm.analyze([kernel(GEMM, COMPUTE, 0, 300)], [(0, 300)])
        c = exposed_comm.combine([a, b])
        self.assertEqual((c["steps"], c["window_us"], c["exposed_allgather_us"]), (2, 400, 50))
        self.assertAlmostEqual(c["exposed_allgather_share"], 50 / 400)
        self.assertEqual(c["events"], {"allgather/gpu_memcpy": 1, "compute/kernel": 2})


class ChromeTrace(unittest.TestCase):
    """The layout Kineto exports: GPU activities with pid = device and tid = stream, the step
    markers as user_annotation CPU ranges of the process."""

    TRACE = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": exposed_comm.STEP_MARKER,
         "pid": 4242, "tid": 4242, "ts": 1000.0, "dur": 500.0},
        {"ph": "X", "cat": "user_annotation", "name": exposed_comm.STEP_MARKER,
         "pid": 4242, "tid": 4242, "ts": 2000.0, "dur": 500.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242,
         "ts": 1001.0, "dur": 5.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": exposed_comm.STEP_MARKER,
         "pid": 0, "tid": 7, "ts": 1009.0, "dur": 400.0},
        {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 1010.0,
         "dur": 100.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": PEER_COPY, "pid": 0, "tid": 33,
         "ts": 1100.0, "dur": 50.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": DEVICE_COPY, "pid": 0, "tid": 7,
         "ts": 1200.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 1700.0,
         "dur": 100.0},  # outside both steps
        {"ph": "X", "cat": "kernel", "name": AG_KERNEL, "pid": 0, "tid": 21, "ts": 2010.0,
         "dur": 30.0},
        {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 2020.0,
         "dur": 80.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 2020.0},
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]}

    def test_events_and_windows(self):
        events = exposed_comm.events_from_trace(self.TRACE)
        self.assertEqual(len(events), 6)
        self.assertEqual(events[1].stream, (0, 33))
        windows = exposed_comm.step_windows(self.TRACE, events)
        self.assertEqual(windows, [(1010.0, 1210.0), (2010.0, 2100.0)])
        r = exposed_comm.analyze(events, windows)
        self.assertEqual(r["steps"], 2)
        self.assertAlmostEqual(r["window_us"], 290.0)
        self.assertAlmostEqual(r["allgather_us"], 80.0)    # the copy 1100-1150 and the kernel
        self.assertAlmostEqual(r["exposed_allgather_us"], 50.0)  # 1110-1150 and 2010-2020
        self.assertAlmostEqual(r["idle_us"], 50.0)  # 1150-1200
        self.assertEqual(r["events"]["other/gpu_memcpy"], 1)

    def test_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            with open(path, "w") as f:
                json.dump(self.TRACE, f)
            r = exposed_comm.analyze_trace_file(path)
        self.assertAlmostEqual(r["exposed_allgather_share"], 50.0 / 290.0)
        self.assertIn("exposed all-gather 17.2 %", exposed_comm.describe(r))


def record(share_us=None, window_us=1000.0, steps=5):
    """The fields of a training record that compare_runs.py reads."""
    rec = {"script": "fsdp2_gpt", "name": "tiny", "world_size": 2, "steps": 20,
           "losses_hex": [["3f800000"] * 20] * 2, "checksum": ["a", "b"], "finite": True,
           "timing": {"median_step_ms": 10.0, "timed_steps": 5}, "zerocta": None,
           "profile": None}
    if share_us is not None:
        rec["profile"] = {"all_ranks": exposed_comm.combine([exposed_comm.analyze(
            [copy(PEER_COPY, CE_STREAM, 0, share_us)], [(0, window_us)])] * steps)}
    return rec


class CompareRuns(unittest.TestCase):
    def compare(self, plain, other):
        return compare_runs.compare(plain, other, second_plain=True, stats_dir=None)

    def test_line_when_both_runs_were_profiled(self):
        _, summary, lines = self.compare(record(200.0), record(50.0))
        self.assertIn("exposed all-gather (profiled steps, all ranks): plain 20.0 % of the step "
                      "(0.20 ms/step), plain #2 5.0 % (0.05 ms/step)", lines)
        self.assertAlmostEqual(summary["exposed_allgather"]["plain"]["share"], 0.2)
        self.assertAlmostEqual(summary["exposed_allgather"]["other"]["ms_per_step"], 0.05)

    def test_unchanged_otherwise(self):
        _, summary, lines = self.compare(record(), record())
        for plain, other in ((record(200.0), record()), (record(), record(50.0))):
            self.assertEqual(self.compare(plain, other)[1:], (summary, lines))
        self.assertNotIn("exposed_allgather", summary)


if __name__ == "__main__":
    unittest.main()
