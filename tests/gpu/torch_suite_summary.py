"""Side by side, per test, the JUnit results of run_torch_suite.sh's modes.

  torch_suite_summary.py OUTDIR MODE...   (reads OUTDIR/MODE.xml)

Prints one line per test (its result in each mode) and a closing count; exits 1 when a test
that passed in the first mode did not pass in a later one.
"""
import os
import sys
import xml.etree.ElementTree as ET


def results(path):
    """test id -> pass | fail | skip | error, from a JUnit file (empty when missing)."""
    if not os.path.exists(path):
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")[-1] + "::" + case.get("name", "")
        kinds = {child.tag for child in case}
        out[name] = ("fail" if "failure" in kinds else "error" if "error" in kinds
                     else "skip" if "skipped" in kinds else "pass")
    return out


def main(argv):
    outdir, modes = argv[1], argv[2:]
    table = {mode: results(os.path.join(outdir, mode + ".xml")) for mode in modes}
    names = sorted(set().union(*table.values()))
    worse = 0
    for name in names:
        row = [table[m].get(name, "absent") for m in modes]
        lost = row[0] == "pass" and any(r != "pass" for r in row[1:])
        worse += lost
        print(f"{'WORSE' if lost else '     '} {name:<90} " + " ".join(f"{r:<6}" for r in row))
    counts = {m: sum(1 for r in table[m].values() if r == "pass") for m in modes}
    print("passed: " + ", ".join(f"{m} {counts[m]}/{len(table[m])}" for m in modes) +
          f"; passed in {modes[0]} but not in every other mode: {worse}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
