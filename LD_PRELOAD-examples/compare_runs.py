#!/usr/bin/env python3
"""Compares two training records (fsdp2_gpt.py / ddp.py --out): a run without zerocta and one
with it. Standard library only.

    compare_runs.py PLAIN.json ZEROCTA.json [--stats-dir DIR] [--summary OUT.json]
        [--label NAME] [--second-plain | --first-zerocta [--first-stats-dir DIR]]
        [--names FIRST SECOND]

Prints whether every rank's loss at every step is bitwise identical (else the first differing
step), whether every rank's final weights are (their checksums), both runs' median step time
and the ratio zerocta/plain, when both runs were profiled (fsdp2_gpt.py --profile-steps) their
exposed all-gather share and time per step (exposed_comm.py), and the routes zerocta counted
for the all-gathers and the reduce-scatters: from the ZEROCTA_STATS JSON files in --stats-dir (one per rank, the whole
process life) when given, with how the route's pairs across processes were settled (the pairs
that fell back to "later does both", at half speed), else from the counters the record holds
(taken in-process after the last step). The last line is the verdict. Exit status: 0 MATCH,
1 MISMATCH or an invalid run, 2 a usage problem.

--second-plain: the second run is also without zerocta (a determinism check of the program
itself: run_pair.sh BASELINE_TWICE=1).

--first-zerocta: the first run is under zerocta too, with other routes (run_pair.sh PAIR_BASE,
e.g. the all-gather route alone against both routes: how much of the gain is the
reduce-scatter's); --first-stats-dir then reports its routes as well. --names: what the report
calls the two runs (default: plain, and zerocta or plain #2).
"""

import argparse
import glob
import json
import os
import struct
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def hex_to_float(h):
    return struct.unpack(">f", bytes.fromhex(h))[0]


def first_loss_difference(a, b):
    """(step, rank, hex a, hex b) of the earliest differing loss, or None if all are equal."""
    first = None
    for rank, (la, lb) in enumerate(zip(a, b)):
        for step, (x, y) in enumerate(zip(la, lb)):
            if x != y:
                if first is None or step < first[0]:
                    first = (step, rank, x, y)
                break
    return first


def load_stats_files(stats_dir):
    """The ZEROCTA_STATS JSON files in stats_dir (src/core/stats.cc's format), one per process, in
    name order."""
    return [load(path) for path in sorted(glob.glob(os.path.join(stats_dir, "*.json")))]


def allgather_routes_from_stats(stats, op="allgather"):
    """Sums of those files: ({route: [calls, bytes]} for op (allgather, reducescatter, ...),
    comm counters, number of files of processes that created a communicator). A process forked
    from a rank without exec writes a file of zeros at exit; such files add nothing and are not
    counted as ranks."""
    routes, comms, ranks = {}, {}, 0
    for s in stats:
        ranks += s.get("comms_created", 0) > 0
        for route, c in s.get("ops", {}).get(op, {}).items():
            acc = routes.setdefault(route, [0, 0])
            acc[0] += c["calls"]
            acc[1] += c["bytes"]
        for key in ("comms_created", "comms_zero_policy", "comms_ce_ready"):
            comms[key] = comms.get(key, 0) + s.get(key, 0)
    return routes, comms, ranks


def pair_settlements_from_stats(stats):
    """How the route's pairs across processes were settled, from those files:
    [(each_pushes, later_does_both)] per process that created a communicator. "Later does
    both" is the pair's fallback at half speed (docs/ARCHITECTURE.md): how often a run took it
    is what moves a comm-heavy step time between runs."""
    return [(s.get("route", {}).get("pairs_each_pushes", 0),
             s.get("route", {}).get("pairs_later_does_both", 0))
            for s in stats if s.get("comms_created", 0) > 0]


def describe_pairs(pairs):
    each = sum(e for e, _ in pairs)
    later = sum(l for _, l in pairs)
    if each + later == 0:
        return "none settled"
    return ("each pushes %d, later does both %d (%.1f %%; per process %s)" %
            (each, later, 100.0 * later / (each + later), ", ".join(str(l) for _, l in pairs)))


def allgather_routes_from_record(zerocta, op="allgather"):
    """The same sums from the per-rank in-process counters a record holds."""
    routes, comms = {}, {}
    for rank_stats in zerocta:
        for key, c in rank_stats["counters"].items():
            key_op, route = key.split("/", 1)
            if key_op == op:
                acc = routes.setdefault(route, [0, 0])
                acc[0] += c["calls"]
                acc[1] += c["bytes"]
        for key in ("comms_created", "comms_zero_policy", "comms_ce_ready"):
            comms[key] = comms.get(key, 0) + rank_stats.get(key, 0)
    return routes, comms


def describe_routes(routes, what="all-gathers"):
    if not routes:
        return "no %s counted" % what
    return ", ".join("%s %d calls (%.1f GiB)" % (r, c, b / 2**30)
                     for r, (c, b) in sorted(routes.items()))


def exposure(rec):
    """(share, ms per step) of the exposed all-gather in a record's profiled steps, all ranks
    together, or None when the run was not profiled or its profile found no step."""
    prof = rec.get("profile")
    if not prof:
        return None
    total = prof["all_ranks"]
    if not total["steps"] or total["exposed_allgather_share"] is None:
        return None
    return total["exposed_allgather_share"], total["exposed_allgather_us"] / total["steps"] / 1000


def zerocta_routes(rec, stats_dir, world_size, name):
    """(problems, summary part, report lines) of the routes zerocta counted in one run: from
    the ZEROCTA_STATS files in stats_dir when given, else from the record's own counters. name:
    the run's name in the lines ("" for the one zerocta run of a pair, as before)."""
    problems, lines, part = [], [], {}
    of = " of %s" % name if name else ""
    pairs, rs_routes = None, {}
    if stats_dir:
        stats = load_stats_files(stats_dir)
        routes, comms, n_files = allgather_routes_from_stats(stats)
        rs_routes = allgather_routes_from_stats(stats, "reducescatter")[0]
        pairs = pair_settlements_from_stats(stats)
        source = "ZEROCTA_STATS files of %d ranks" % n_files
        if n_files != world_size:
            problems.append("ZEROCTA_STATS files of %d processes with communicators in %s, "
                            "expected %s (one per rank)" % (n_files, stats_dir, world_size))
    else:
        routes, comms = allgather_routes_from_record(rec.get("zerocta") or [])
        rs_routes = allgather_routes_from_record(rec.get("zerocta") or [], "reducescatter")[0]
        source = "in-process counters after the last step"
    lines.append("zerocta all-gather routes%s, all ranks (%s): %s" %
                 (of, source, describe_routes(routes)))
    if rs_routes:  # a program without reduce-scatters (ddp.py) keeps the report it had
        lines.append("zerocta reduce-scatter routes%s, all ranks: %s" %
                     (of, describe_routes(rs_routes, "reduce-scatters")))
    lines.append("zerocta communicators%s: created %s, zero CTA policy %s, copy-engine pool %s"
                 % (of, comms.get("comms_created"), comms.get("comms_zero_policy"),
                    comms.get("comms_ce_ready")))
    if pairs is not None:
        lines.append("zerocta pairs across processes%s: %s" % (of, describe_pairs(pairs)))
        part["pairs"] = {"each_pushes": [e for e, _ in pairs],
                         "later_does_both": [l for _, l in pairs]}
    part["allgather_routes"] = {r: {"calls": c, "bytes": b} for r, (c, b) in routes.items()}
    part["reducescatter_routes"] = {r: {"calls": c, "bytes": b}
                                    for r, (c, b) in rs_routes.items()}
    part["comms"] = comms
    part["route_source"] = source
    return problems, part, lines


def compare(plain, other, second_plain, stats_dir, first_zerocta=False, first_stats_dir=None,
            names=None):
    """Returns (problems, summary dict, report lines). first_zerocta: the first run is under
    zerocta too (other routes), not plain; names: what the lines call the two runs."""
    if second_plain and first_zerocta:
        raise ValueError("second_plain and first_zerocta exclude each other")
    first, second = names or ("plain", "plain #2" if second_plain else "zerocta")
    problems, lines = [], []
    for key in ("script", "name", "config", "world_size", "steps", "seed", "deterministic"):
        if plain.get(key) != other.get(key):
            problems.append("the runs differ in %s: %r vs %r" % (key, plain.get(key),
                                                                 other.get(key)))
    if first_zerocta and plain.get("zerocta") is None:
        problems.append("zerocta was not loaded in the first run (%s)" % first)
    if not first_zerocta and plain.get("zerocta") is not None:
        problems.append("zerocta was loaded in the plain run")
    if second_plain and other.get("zerocta") is not None:
        problems.append("zerocta was loaded in the second plain run")
    if not second_plain and other.get("zerocta") is None:
        problems.append("zerocta was not loaded in the zerocta run")
    for label, rec in (("plain" if not first_zerocta else "first", plain), ("second", other)):
        if not rec.get("finite", False):
            problems.append("the %s run had a non-finite loss" % label)
        if rec.get("replicated") and len(set(rec["checksum"])) != 1:
            problems.append("the %s run's replicas differ (checksums %s)" %
                            (label, rec["checksum"]))

    diff = first_loss_difference(plain["losses_hex"], other["losses_hex"])
    losses_equal = diff is None and len(plain["losses_hex"]) == len(other["losses_hex"])
    weights_equal = plain["checksum"] == other["checksum"]
    n_ranks, n_steps = len(plain["losses_hex"]), len(plain["losses_hex"][0])
    if losses_equal:
        lines.append("losses bitwise identical: yes (%d steps x %d ranks)" % (n_steps, n_ranks))
    elif diff is None:
        lines.append("losses bitwise identical: no (different numbers of ranks)")
    else:
        step, rank, x, y = diff
        lines.append("losses bitwise identical: no, first at step %d rank %d: %r (%s) vs %r (%s)"
                     % (step, rank, hex_to_float(x), x, hex_to_float(y), y))
    lines.append("final weights bitwise identical: %s" % ("yes" if weights_equal else
                                                          "no (checksums %s vs %s)" %
                                                          (plain["checksum"],
                                                           other["checksum"])))
    if not losses_equal:
        problems.append("losses differ")
    if not weights_equal:
        problems.append("final weights differ")

    t0 = plain["timing"].get("median_step_ms")
    t1 = other["timing"].get("median_step_ms")
    ratio = t1 / t0 if t0 and t1 else None
    if ratio is not None:
        lines.append("median step: %s %.2f ms, %s %.2f ms, ratio %.3f (%d timed steps, "
                     "slowest rank per step)" % (first, t0, second, t1, ratio,
                                                 plain["timing"]["timed_steps"]))
    e0, e1 = exposure(plain), exposure(other)
    if e0 and e1:
        lines.append("exposed all-gather (profiled steps, all ranks): %s %.1f %% of the step "
                     "(%.2f ms/step), %s %.1f %% (%.2f ms/step)" %
                     (first, 100 * e0[0], e0[1], second, 100 * e1[0], e1[1]))

    # "plain"/"other" stay the keys whatever the runs are called (fsdp2_summary.py, old sweeps).
    summary = {"losses_identical": losses_equal, "weights_identical": weights_equal,
               "first_difference": (None if diff is None else
                                    {"step": diff[0], "rank": diff[1], "plain": diff[2],
                                     "other": diff[3]}),
               "median_step_ms": {"plain": t0, "other": t1}, "ratio": ratio,
               "names": [first, second], "first_zerocta": first_zerocta}
    if e0 and e1:
        summary["exposed_allgather"] = {"plain": {"share": e0[0], "ms_per_step": e0[1]},
                                        "other": {"share": e1[0], "ms_per_step": e1[1]}}
    if first_zerocta:
        p, part, more = zerocta_routes(plain, first_stats_dir, plain.get("world_size"), first)
        problems += p
        lines += more
        summary["first_routes"] = part
    if not second_plain:
        p, part, more = zerocta_routes(other, stats_dir, plain.get("world_size"),
                                       second if first_zerocta else "")
        problems += p
        lines += more
        summary.update(part)
    return problems, summary, lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("plain")
    p.add_argument("other")
    p.add_argument("--stats-dir", help="directory of the zerocta run's ZEROCTA_STATS files")
    p.add_argument("--summary", help="write the comparison as JSON here")
    p.add_argument("--label", help="name printed in the verdict (default: the record's)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--second-plain", action="store_true",
                       help="the second run is also without zerocta")
    which.add_argument("--first-zerocta", action="store_true",
                       help="the first run is under zerocta too (other routes)")
    p.add_argument("--first-stats-dir",
                   help="with --first-zerocta: directory of the first run's ZEROCTA_STATS files")
    p.add_argument("--names", nargs=2, metavar=("FIRST", "SECOND"),
                   help="what the report calls the two runs")
    args = p.parse_args()
    if args.first_stats_dir and not args.first_zerocta:
        p.error("--first-stats-dir needs --first-zerocta")

    try:
        plain, other = load(args.plain), load(args.other)
    except (OSError, ValueError) as e:
        print("VERDICT %s: FAILED: cannot read the records: %s" % (args.label or "-", e))
        return 1
    label = args.label or "%s %s" % (plain.get("script"), plain.get("name"))
    problems, summary, lines = compare(plain, other, args.second_plain, args.stats_dir,
                                       args.first_zerocta, args.first_stats_dir, args.names)
    for line in lines:
        print("%s: %s" % (label, line))
    verdict = "MATCH" if not problems else "MISMATCH: " + "; ".join(problems)
    if not problems:
        verdict += " (bitwise identical losses and weights%s)" % (
            "" if summary["ratio"] is None else ", step time ratio %.3f" % summary["ratio"])
    print("VERDICT %s: %s" % (label, verdict))
    summary.update({"label": label, "match": not problems, "problems": problems,
                    "plain": os.path.abspath(args.plain), "other": os.path.abspath(args.other),
                    "second_plain": args.second_plain})
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
