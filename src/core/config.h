// The ZEROCTA_* configuration: one table of every variable, parsed once, validated strictly.
// Glossary: "fingerprint" = hash of every value that can change what peers expect from a
// rank; ranks compare fingerprints before using the copy-engine route.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "log.h"

namespace zc {

enum class CtaPolicyMode { kZero, kEfficiency, kDefault, kKeep };
// A collective's route: ZEROCTA_ALLGATHER and ZEROCTA_REDUCESCATTER take the same words.
enum class RouteMode { kAuto, kZerocta, kNccl, kOff };

// Defaults of the size variables; config_table() shows the same values as text.
constexpr uint64_t kDefaultMinBytes = 64ull << 20;
// auto's route is measured to beat NCCL's kernel path on 2, 3 and 4 ranks, alone and beside
// GEMMs (docs/PERFORMANCE.md); 8 GPUs were not lent to measure it.
constexpr uint64_t kDefaultAutoMaxRanks = 4;
// The reduce-scatter's scratch per communicator, at most: every rank's peers push their chunks
// into it, two slices of each peer, in a region for eager ops and one for captured ops
// (reduce_scatter_plan.h); 128 MiB gives 3 or more ranks 64 MiB regions, and 2 ranks their
// slices of the largest size (16 MiB) in 2 x 32 MiB.
constexpr uint64_t kDefaultRsScratchBytes = 128ull << 20;
// The most ranks whose reduce-scatters auto routes: 2, the count the route is built and first
// measured for (docs/PERFORMANCE.md, "Reduce-scatter"); larger counts take ZEROCTA_REDUCESCATTER=zerocta.
constexpr uint64_t kRsAutoMaxRanks = 2;
// CTAs of the reduce-scatter's summing kernel (chunk_sum.h). On 2 ranks the copy engines bring
// ~390 GB/s a direction, which the sum turns into ~1.2 TB/s of HBM traffic; beside bf16 GEMMs
// on one H200 32 CTAs summed at 987 GB/s (16: 550) for a GEMM slowdown within the noise of
// 16's (1.027x against 1.013x, docs/plots/reduce-scatter-1xH200/sum-beside-gemm-probe.txt).
// The 2-GPU fixed-work run is to confirm it (docs/PERFORMANCE.md, "Reduce-scatter").
constexpr uint64_t kDefaultRsCtas = 32;

// A default-constructed Config holds every documented default (no variable set).
struct Config {
  bool enable = true;                               // ZEROCTA_ENABLE
  bool strict = false;                              // ZEROCTA_STRICT
  LogLevel log = LogLevel::kWarn;                   // ZEROCTA_LOG; unset: follows NCCL_DEBUG
  bool log_from_nccl_debug = false;                 // `log` is NCCL_DEBUG's (ZEROCTA_LOG unset)
  CtaPolicyMode cta_policy = CtaPolicyMode::kZero;  // ZEROCTA_CTA_POLICY
  bool cta_policy_force = false;                    // ZEROCTA_CTA_POLICY_FORCE
  // nccl until zerocta's copy-engine route beats NCCL's kernel path (docs/PERFORMANCE.md).
  RouteMode allgather = RouteMode::kNccl;  // ZEROCTA_ALLGATHER
  uint64_t min_bytes = kDefaultMinBytes;           // ZEROCTA_MIN_BYTES (total output bytes)
  uint64_t auto_max_ranks = kDefaultAutoMaxRanks;  // ZEROCTA_AUTO_MAX_RANKS (0 = any)
  RouteMode reducescatter = RouteMode::kNccl;       // ZEROCTA_REDUCESCATTER
  uint64_t rs_scratch_bytes = kDefaultRsScratchBytes;  // ZEROCTA_RS_SCRATCH
  uint64_t rs_ctas = kDefaultRsCtas;                   // ZEROCTA_RS_CTAS
  std::string stats;                               // ZEROCTA_STATS: "" | "0" | "1" | a path
  bool nvtx = true;                                // ZEROCTA_NVTX
  std::string nccl_library;                        // ZEROCTA_NCCL_LIBRARY
  std::string channel_dir = "/dev/shm";            // ZEROCTA_CHANNEL_DIR

  // NCCL's own variables that zerocta follows (nccl_var_names()); NCCL judges their values,
  // so they never give an error line here.
  std::string log_file;               // NCCL_DEBUG_FILE: zerocta's lines go there ("" = stderr)
  bool nccl_writes_log_file = false;  // NCCL_DEBUG above VERSION: NCCL opens log_file too

  // One line per bad value, e.g.
  // ZEROCTA_LOG="verbose" is invalid (accepted: none|warn|info|debug); using the default "warn"
  // Lines never contain a newline: the bad value is escaped and shortened.
  std::vector<std::string> errors;
  // Hash of the values that change the inter-rank protocol (allgather, min_bytes,
  // auto_max_ranks, reducescatter, rs_scratch_bytes, enable, cta_policy). Identical configs
  // give identical hashes.
  uint64_t fingerprint = 0;
};

// One row of the variable table (also used to generate/check the README table).
// Whether a mode asks for zerocta's copy-engine route (auto or zerocta).
inline bool route_asked(RouteMode m) { return m == RouteMode::kAuto || m == RouteMode::kZerocta; }

struct ConfigVar {
  const char* name;     // "ZEROCTA_LOG"
  const char* type;     // "enum", "bool", "size", "count", "string"
  const char* values;   // "none|warn|info|debug", "0|1|true|...", "size ...", "path"
  const char* def;      // default as text ("" = unset)
  const char* meaning;  // one sentence
};
const std::vector<ConfigVar>& config_table();

// The README table: "| Variable | Meaning | Values | Default |", one row per config_table()
// entry, newline-terminated. tools/zerocta-env-table prints exactly this.
std::string config_table_markdown();

// Returns the value of a variable, or nullptr when it is unset.
using EnvLookup = std::function<const char*(const char*)>;

// NCCL's variables that parse_config reads besides config_table(): NCCL_DEBUG (zerocta's level
// while ZEROCTA_LOG is unset) and NCCL_DEBUG_FILE (where zerocta's lines go).
const std::vector<const char*>& nccl_var_names();

// zerocta's level for an NCCL_DEBUG value, compared ignoring case as NCCL does: NONE and
// VERSION -> none (NCCL prints no warning at either), WARN -> warn, INFO and ABORT -> info,
// TRACE -> debug. Returns false for any other text and then leaves *out unchanged.
bool log_level_for_nccl_debug(const char* text, LogLevel* out);

// Pure: parses from the given lookup (tests pass a map). Never prints. Reads exactly the
// variables of config_table() and nccl_var_names(), each once.
Config parse_config(const EnvLookup& getenv_fn);

// Parsed once from the process environment, cached; thread-safe. Does not print either: the
// caller that initializes the library sets the log level and reports config().errors once.
const Config& config();

// The fingerprint of c's protocol fields (what parse_config stores in c.fingerprint).
// Stable across processes and builds: FNV-1a over a canonical text.
uint64_t config_fingerprint(const Config& c);

// A variable named ZEROCTA_* that zerocta does not read: most likely a misspelt setting
// (ZEROCTA_ALLGATHR=auto would otherwise run the default without a word).
struct UnknownVar {
  std::string name;     // "ZEROCTA_ALLGATHR"
  std::string closest;  // "ZEROCTA_ALLGATHER": the config_table() name nearest to it
  size_t distance = 0;  // edit_distance(name, closest)
};

// Names of ZEROCTA_* variables that zerocta's tools and example scripts read, not the library
// (zerocta-run's and zerocta-bench's ZEROCTA_LIB, LD_PRELOAD-examples/'s ZEROCTA_BUILD, ...):
// known, so never reported, but not suggested either.
const std::vector<const char*>& tool_var_names();

// Pure: the ZEROCTA_* names of `envp` ("NAME=value" entries, nullptr-terminated, as environ)
// that are neither in config_table() nor tool_var_names(), each once, in the order of envp.
// envp == nullptr gives none.
std::vector<UnknownVar> find_unknown_vars(const char* const* envp);

// find_unknown_vars(environ): the process environment as it is now.
std::vector<UnknownVar> find_unknown_vars_in_environment();

// The one WARN line for u, e.g.
// ZEROCTA_ALLGATHR is not a zerocta variable and is ignored; did you mean ZEROCTA_ALLGATHER?
// ("did you mean" up to kSuggestDistance edits; beyond, it names the nearest known variable).
// tools/zerocta-run prints the same text.
std::string unknown_var_line(const UnknownVar& u);
constexpr size_t kSuggestDistance = 3;

// Edits (insert, delete, substitute one character, swap two adjacent ones) that turn a into
// b, ignoring ASCII case.
size_t edit_distance(const std::string& a, const std::string& b);

// Parses a size: decimal digits with an optional K/M/G/T suffix (powers of 1024,
// also "KiB"/"MiB"/"GiB"/"TiB", and lower-case "k"/"m"/"g"/"t"); rejects negatives, junk,
// whitespace, overflow. Returns false on error and then leaves *out unchanged.
bool parse_size(const char* text, uint64_t* out);

// Parses a count: plain decimal digits, at most 1000000 (no suffix, sign or whitespace).
// Returns false on error and then leaves *out unchanged.
bool parse_count(const char* text, uint64_t* out);

// Shortest exact text for a size with a K/M/G/T suffix where one fits: 16777216 -> "16M",
// 1000 -> "1000". parse_size(format_size(v)) == v for every v.
std::string format_size(uint64_t bytes);

// `text` as it appears in a log line: quoted, escaped to one printable line, shortened.
std::string quoted(const char* text);

const char* to_string(CtaPolicyMode m);
const char* to_string(RouteMode m);
const char* to_string(LogLevel l);

}  // namespace zc
