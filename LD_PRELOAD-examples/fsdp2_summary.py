"""One JSON for a sweep of run_fsdp2.sh: every pair's compare_runs.py summary, and per
configuration its step-time ratios (zerocta / plain, in run order), their median and the largest.

    fsdp2_summary.py [--compared TEXT] OUT.json PAIR_DIR/summary.json...

--compared: what the pairs compared (run_fsdp2.sh: e.g. "zerocta ag=auto rs=auto vs plain"),
kept in the JSON and printed in the lines: the ratios are the second run's step time over the
first's.

A pair directory is named fsdp2-CONFIG or fsdp2-CONFIG-pI (pair I of several); a pair that failed
before comparing has no summary.json and counts as not matching. Prints one line per configuration
that ran several pairs. Standard library only.
"""

import json
import os
import re
import statistics
import sys


def summarize(paths, compared=None):
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
    return {"pairs": pairs, "configs": configs, "compared": compared,
            "all_match": all(v["match"] for v in pairs.values())}


def line(config, c, compared=None):
    fmt = lambda x: "-" if x is None else "%.3f" % x  # noqa: E731
    return "run_fsdp2: %s: %d pairs, step-time ratio%s median %s, largest %s, %s" % (
        config, c["pairs"], " (%s)" % compared if compared else "",
        fmt(c["median_ratio"]), fmt(c["max_ratio"]),
        "bitwise in every pair" if c["all_match"] else "NOT bitwise in all")


def main(argv):
    args, compared = argv[1:], None
    if args[:1] == ["--compared"] and len(args) >= 2:
        compared, args = args[1], args[2:]
    if not args or args[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    summary = summarize(args[1:], compared)
    for config, c in summary["configs"].items():
        if c["pairs"] > 1:
            print(line(config, c, compared))
    with open(args[0], "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
