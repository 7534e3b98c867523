"""One JSON for a sweep of run_fsdp2.sh: every pair's compare_runs.py summary, and per
configuration its step-time ratios (zerocta / plain, in run order), their median and the largest.

    fsdp2_summary.py OUT.json PAIR_DIR/summary.json...

A pair directory is named fsdp2-CONFIG or fsdp2-CONFIG-pI (pair I of several); a pair that failed
before comparing has no summary.json and counts as not matching. Prints one line per configuration
that ran several pairs. Standard library only.
"""

import json
import os
import re
import statistics
import sys


def summarize(paths):
    pairs, by_config = {}, {}
    for p in paths:
        name = os.path.basename(os.path.dirname(p))
        if os.path.exists(p):
            with open(p) as f:
                pairs[name] = json.load(f)
        else:
            pairs[name] = {"match": False, "problems": ["run failed"]}
        by_config.setdefault(re.sub(r"-p[0-9]+$", "", name), []).append(pairs[name])
    configs = {}
    for config, runs in by_config.items():
        ratios = [r.get("ratio") for r in runs]
        timed = [x for x in ratios if x is not None]
        configs[config] = {"pairs": len(runs), "ratios": ratios,
                           "all_match": all(r["match"] for r in runs),
                           "median_ratio": statistics.median(timed) if timed else None,
                           "max_ratio": max(timed) if timed else None}
    return {"pairs": pairs, "configs": configs,
            "all_match": all(v["match"] for v in pairs.values())}


def line(config, c):
    fmt = lambda x: "-" if x is None else "%.3f" % x  # noqa: E731
    return "run_fsdp2: %s: %d pairs, step-time ratio median %s, largest %s, %s" % (
        config, c["pairs"], fmt(c["median_ratio"]), fmt(c["max_ratio"]),
        "bitwise in every pair" if c["all_match"] else "NOT bitwise in all")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    summary = summarize(argv[2:])
    for config, c in summary["configs"].items():
        if c["pairs"] > 1:
            print(line(config, c))
    with open(argv[1], "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
