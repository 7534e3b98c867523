"""zerocta's counters, read from inside the process through its C API (include/zerocta.h).

The shim is LD_PRELOADed, so its functions are in the process's global scope:
ctypes.CDLL(None) is dlopen(NULL), and a missing zerocta_get_stats means "not loaded".
Shared by collectives.py and overlap_172714.py; no dependency beyond the standard library.
"""

import ctypes

# zerocta.h: zerocta_op_count and zerocta_route_count. The struct's layout depends on them;
# _load() checks them against the loaded library's name tables before trusting the layout.
OP_COUNT = 10
ROUTE_COUNT = 3


class Counter(ctypes.Structure):  # zerocta_counter_t
    _fields_ = [("calls", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class Stats(ctypes.Structure):  # zerocta_stats_t
    _fields_ = [
        ("counters", (Counter * ROUTE_COUNT) * OP_COUNT),
        ("comms_created", ctypes.c_uint64),
        ("comms_zero_policy", ctypes.c_uint64),
        ("comms_ce_ready", ctypes.c_uint64),
        ("pool_bytes", ctypes.c_uint64),
        ("inner_calls", ctypes.c_uint64),
    ]


def _load():
    process = ctypes.CDLL(None)
    try:
        get_stats = process.zerocta_get_stats
    except AttributeError:
        return None
    get_stats.argtypes = [ctypes.POINTER(Stats)]
    get_stats.restype = ctypes.c_int
    version = process.zerocta_version
    version.restype = ctypes.c_int
    op_name, route_name = process.zerocta_op_name, process.zerocta_route_name
    for fn in (op_name, route_name):
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_char_p
    # The last valid index has a name and the next one has none: the counts match the header.
    if (op_name(OP_COUNT - 1) is None or op_name(OP_COUNT) is not None
            or route_name(ROUTE_COUNT - 1) is None or route_name(ROUTE_COUNT) is not None):
        raise RuntimeError("libzerocta.so does not match zerocta_stats.py's copy of zerocta.h")
    v = version()
    return {
        "get_stats": get_stats,
        "version": "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100),
        "ops": [op_name(i).decode() for i in range(OP_COUNT)],
        "routes": [route_name(i).decode() for i in range(ROUTE_COUNT)],
    }


_SHIM = _load()


def loaded():
    return _SHIM is not None


def version():
    return _SHIM["version"] if _SHIM else None


def snapshot():
    """{"counters": {(op, route): (calls, bytes)} for non-zero counters, "comms_created": ...},
    or None when zerocta is not loaded."""
    if not _SHIM:
        return None
    s = Stats()
    if _SHIM["get_stats"](ctypes.byref(s)) != 0:
        raise RuntimeError("zerocta_get_stats failed")
    counters = {}
    for op in range(OP_COUNT):
        for route in range(ROUTE_COUNT):
            c = s.counters[op][route]
            if c.calls or c.bytes:
                counters[(_SHIM["ops"][op], _SHIM["routes"][route])] = (c.calls, c.bytes)
    out = {"counters": counters}
    for name, _ in Stats._fields_[1:]:
        out[name] = getattr(s, name)
    return out


def routes_between(before, after, op="allgather"):
    """Routes that op's calls took between two snapshots, e.g. "ce" or "ce+passthrough";
    "-" when zerocta is not loaded."""
    if before is None or after is None:
        return "-"
    taken = [route for (o, route), (calls, _) in after["counters"].items()
             if o == op and calls > before["counters"].get((o, route), (0, 0))[0]]
    return "+".join(sorted(taken)) or "none"


def describe(snap):
    """Human-readable lines for a snapshot (the same facts ZEROCTA_STATS=1 prints at exit)."""
    if snap is None:
        return ["zerocta not loaded"]
    lines = ["%s %s calls=%d bytes=%d" % (op, route, calls, nbytes)
             for (op, route), (calls, nbytes) in sorted(snap["counters"].items())]
    lines.append("comms created=%d zero_policy=%d ce_ready=%d pool_bytes=%d" %
                 (snap["comms_created"], snap["comms_zero_policy"], snap["comms_ce_ready"],
                  snap["pool_bytes"]))
    return lines
