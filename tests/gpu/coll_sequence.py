#!/usr/bin/env python3
"""Compares the collectives NCCL itself logged in two runs (NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=COLL): per rank (process and device), the sequence of
(op, count, datatype, op, root, communicator) must be the same. Communicators are numbered in
the order each rank first used them, buffer and stream addresses are ignored.

    coll_sequence.py WITHOUT.log WITH.log     exit 0 when equal, 1 with the first difference
    coll_sequence.py --show RUN.log           prints the normalised sequences
"""
import re
import sys

LINE = re.compile(
    r"^(?P<host>[^:\s]+):(?P<pid>\d+):\d+ \[(?P<dev>-?\d+)\] NCCL INFO (?P<op>\w+): "
    r"opCount \w+ .*?count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+)")


def sequences(path):
    """{rank key: [entry, ...]} with ranks numbered by first appearance of (pid, dev)."""
    ranks, comms, seqs = {}, {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m:
                continue
            who = (m["host"], m["pid"], m["dev"])
            rank = ranks.setdefault(who, len(ranks))
            mine = comms.setdefault(rank, {})
            comm = mine.setdefault(m["comm"], len(mine))
            seqs.setdefault(rank, []).append(
                f'{m["op"]} count={m["count"]} dtype={m["dtype"]} op={m["redop"]} '
                f'root={m["root"]} comm#{comm}')
    # Ranks are compared by their device and order of appearance, not by pid.
    keyed = {}
    for (host, pid, dev), rank in ranks.items():
        n = sum(1 for k in keyed if k.startswith(f"dev{dev}/"))
        keyed[f"dev{dev}/{n}"] = seqs[rank]
    return keyed


def main(argv):
    if len(argv) == 3 and argv[1] == "--show":
        for k, v in sorted(sequences(argv[2]).items()):
            print(k)
            for e in v:
                print("  " + e)
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = sequences(argv[1]), sequences(argv[2])
    total = sum(len(v) for v in a.values())
    if total == 0:
        print(f"no COLL lines in {argv[1]}: was NCCL_DEBUG_SUBSYS=COLL set?")
        return 1
    if sorted(a) != sorted(b):
        print(f"different ranks: {sorted(a)} vs {sorted(b)}")
        return 1
    for k in sorted(a):
        if a[k] != b[k]:
            for i, (x, y) in enumerate(zip(a[k] + ["<end>"], b[k] + ["<end>"])):
                if x != y:
                    print(f"{k}: entry {i} differs: {x!r} vs {y!r} "
                          f"({len(a[k])} vs {len(b[k])} entries)")
                    return 1
    print(f"same COLL sequence: {len(a)} ranks, {total} collectives")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
