// The ZEROCTA_* variables: one table drives parsing, the README table and the fuzzer, so a
// variable cannot be documented without being read, or read without being documented.
#include "config.h"

#include <unistd.h>  // environ

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zc {
namespace {

constexpr const char* kBoolValues = "0|1|true|false|yes|no|on|off";
// Enough of a bad value to recognize it; the rest of a line is ours.
constexpr size_t kMaxQuotedBytes = 64;

bool equals_ignore_case(const char* a, const char* b) {
  for (; *a != '\0' && *b != '\0'; ++a, ++b) {
    char ca = *a >= 'A' && *a <= 'Z' ? static_cast<char>(*a - 'A' + 'a') : *a;
    char cb = *b >= 'A' && *b <= 'Z' ? static_cast<char>(*b - 'A' + 'a') : *b;
    if (ca != cb) return false;
  }
  return *a == *b;
}

bool parse_bool(const char* text, bool* out) {
  static const char* const kTrue[] = {"1", "true", "yes", "on"};
  static const char* const kFalse[] = {"0", "false", "no", "off"};
  for (const char* word : kTrue) {
    if (equals_ignore_case(text, word)) {
      *out = true;
      return true;
    }
  }
  for (const char* word : kFalse) {
    if (equals_ignore_case(text, word)) {
      *out = false;
      return true;
    }
  }
  return false;
}

// Enum words are exactly what to_string prints, so parse and print cannot disagree.
template <typename E, size_t N>
bool parse_enum(const char* text, const E (&all)[N], E* out) {
  for (E e : all) {
    if (equals_ignore_case(text, to_string(e))) {
      *out = e;
      return true;
    }
  }
  return false;
}

constexpr LogLevel kLogLevels[] = {LogLevel::kNone, LogLevel::kWarn, LogLevel::kInfo,
                                   LogLevel::kDebug};
constexpr CtaPolicyMode kCtaPolicies[] = {CtaPolicyMode::kZero, CtaPolicyMode::kEfficiency,
                                          CtaPolicyMode::kDefault, CtaPolicyMode::kKeep};
constexpr RouteMode kRouteModes[] = {RouteMode::kAuto, RouteMode::kZerocta, RouteMode::kNccl,
                                     RouteMode::kOff};

constexpr const char* kLogVar = "ZEROCTA_LOG";
constexpr const char* kNcclDebugVar = "NCCL_DEBUG";
constexpr const char* kNcclDebugFileVar = "NCCL_DEBUG_FILE";

// NCCL_DEBUG's words and what they mean here. `nccl_opens_file`: NCCL writes NCCL_DEBUG_FILE
// at that level (it opens the file only above VERSION, src/debug.cc in NCCL). NONE is not
// NCCL's word, but NCCL prints nothing with it, and neither does zerocta then.
struct NcclDebugWord {
  const char* word;
  LogLevel level;
  bool nccl_opens_file;
};
constexpr NcclDebugWord kNcclDebugWords[] = {
    {"NONE", LogLevel::kNone, false}, {"VERSION", LogLevel::kNone, false},
    {"WARN", LogLevel::kWarn, true},  {"INFO", LogLevel::kInfo, true},
    {"ABORT", LogLevel::kInfo, true}, {"TRACE", LogLevel::kDebug, true},
};

const NcclDebugWord* nccl_debug_word(const char* text) {
  for (const NcclDebugWord& w : kNcclDebugWords)
    if (text != nullptr && equals_ignore_case(text, w.word)) return &w;
  return nullptr;
}

// Stores a variable's value into the config; false = the text is not acceptable (the config
// is then unchanged and keeps the default).
using Apply = bool (*)(const char* text, Config* c);

struct VarSpec {
  ConfigVar row;
  Apply apply;
};

const std::vector<VarSpec>& specs() {
  static const std::vector<VarSpec> kSpecs = {
      {{"ZEROCTA_ENABLE", "bool", kBoolValues, "1",
        "0 makes the library a pure forwarder to NCCL that changes nothing."},
       [](const char* t, Config* c) { return parse_bool(t, &c->enable); }},
      {{"ZEROCTA_STRICT", "bool", kBoolValues, "0",
        "1 makes every NCCL call fail with ncclInvalidUsage while a ZEROCTA_* value is "
        "invalid (an unknown ZEROCTA_* name only warns)."},
       [](const char* t, Config* c) { return parse_bool(t, &c->strict); }},
      {{kLogVar, "enum", "none|warn|info|debug", "warn",
        "How much zerocta logs, in NCCL's line format, to stderr or, with NCCL_DEBUG_FILE set, "
        "to the file it names (%h host, %p pid, as NCCL expands it); unset, it follows "
        "NCCL_DEBUG (NONE and VERSION = none, WARN = warn, INFO and ABORT = info, TRACE = "
        "debug)."},
       [](const char* t, Config* c) { return parse_enum(t, kLogLevels, &c->log); }},
      {{"ZEROCTA_CTA_POLICY", "enum", "zero|efficiency|default|keep", "zero",
        "CTA policy given to every communicator (keep = leave the application's config "
        "untouched; NCCL_CTA_POLICY in the environment overrides it); it decides whether NCCL "
        "may run its own copy-engine path on NCCL windows."},
       [](const char* t, Config* c) { return parse_enum(t, kCtaPolicies, &c->cta_policy); }},
      {{"ZEROCTA_CTA_POLICY_FORCE", "bool", kBoolValues, "0",
        "1 lets ZEROCTA_CTA_POLICY override a CTA policy the application set explicitly."},
       [](const char* t, Config* c) { return parse_bool(t, &c->cta_policy_force); }},
      {{"ZEROCTA_ALLGATHER", "enum", "auto|zerocta|nccl|off", "nccl",
        "Route of all-gathers: nccl = NCCL decides (its CE path on application windows), the "
        "default; auto = zerocta's zero-copy copy-engine route from ZEROCTA_MIN_BYTES up on up to "
        "ZEROCTA_AUTO_MAX_RANKS ranks, when every rank of the communicator agreed; zerocta = that "
        "route for every all-gather; off = the same as nccl."},
       [](const char* t, Config* c) { return parse_enum(t, kRouteModes, &c->allgather); }},
      {{"ZEROCTA_MIN_BYTES", "size", "bytes, or with a K/M/G/T or KiB/MiB/GiB/TiB suffix", "64M",
        "Smallest all-gather (total output bytes) that auto routes to the copy engines."},
       [](const char* t, Config* c) { return parse_size(t, &c->min_bytes); }},
      {{"ZEROCTA_AUTO_MAX_RANKS", "count", "0 (any) or a number of ranks", "4",
        "Largest communicator whose all-gathers auto routes to the copy engines (the largest "
        "measured where the route beats NCCL's kernel path)."},
       [](const char* t, Config* c) { return parse_count(t, &c->auto_max_ranks); }},
      {{"ZEROCTA_REDUCESCATTER", "enum", "auto|zerocta|nccl|off", "nccl",
        "Route of reduce-scatters (sum, average and pre-multiplied sums of float, half and "
        "bfloat16): nccl = NCCL's "
        "kernels, the default; auto = zerocta's copy-engine route (peers' chunks pushed by copy "
        "engines, summed by a small kernel) from ZEROCTA_MIN_BYTES of input up on 2 ranks, when "
        "every rank agreed; zerocta = that route for every such reduce-scatter on up to 8 "
        "ranks; off = the same as nccl."},
       [](const char* t, Config* c) { return parse_enum(t, kRouteModes, &c->reducescatter); }},
      {{"ZEROCTA_RS_SCRATCH", "size", "bytes, or with a K/M/G/T or KiB/MiB/GiB/TiB suffix", "128M",
        "GPU memory per communicator at most into which the peers push a routed reduce-scatter's "
        "chunks: half for ops issued eagerly, half for ops captured into CUDA graphs, each half "
        "two slices of up to 16 MiB of each peer (2 ranks use 66M; an op larger than a slice "
        "goes in several; 0 = no copy-engine reduce-scatter)."},
       [](const char* t, Config* c) { return parse_size(t, &c->rs_scratch_bytes); }},
      {{"ZEROCTA_RS_CTAS", "count", "0 (the default) or a number of CTAs", "32",
        "CTAs of the kernel that sums a routed reduce-scatter's chunks (few: it runs beside "
        "compute)."},
       [](const char* t, Config* c) { return parse_count(t, &c->rs_ctas); }},
      {{"ZEROCTA_STATS", "string", "empty or 0 = off, 1 = stderr, anything else = a path", "",
        "Prints the counters at exit to stderr (1; shown whatever ZEROCTA_LOG says) or writes "
        "them as JSON to the given path (%h host, %p pid, %r rank, %% %), also at every "
        "communicator teardown."},
       // Any text is acceptable; an empty value is the same as unset.
       [](const char* t, Config* c) {
         c->stats = t;
         return true;
       }},
      {{"ZEROCTA_NVTX", "bool", kBoolValues, "1",
        "1 emits NVTX ranges (domain zerocta) around each intercepted collective."},
       [](const char* t, Config* c) { return parse_bool(t, &c->nvtx); }},
      {{"ZEROCTA_NCCL_LIBRARY", "string", "a path to libnccl.so", "",
        "The libnccl to load when the process has not loaded one yet."},
       [](const char* t, Config* c) {
         c->nccl_library = t;
         return true;
       }},
      {{"ZEROCTA_CHANNEL_DIR", "string", "a directory", "/dev/shm",
        "Where the ranks of a communicator meet to agree on the copy-engine route (one "
        "short-lived shared-memory file per communicator); ranks meet only if they see the same "
        "directory."},
       [](const char* t, Config* c) {
         if (*t == '\0') return false;
         c->channel_dir = t;
         return true;
       }},
  };
  return kSpecs;
}

// Text as it goes into a log line: escaped so it stays one printable line, and cut after
// kMaxQuotedBytes so a huge value cannot flood the log (*cut says whether it was).
std::string escape(const char* text, bool* cut) {
  std::string q;
  size_t n = 0;
  for (; text[n] != '\0' && n < kMaxQuotedBytes; ++n) {
    unsigned char ch = static_cast<unsigned char>(text[n]);
    if (ch == '"' || ch == '\\') {
      q += '\\';
      q += static_cast<char>(ch);
    } else if (ch < 0x20 || ch >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", ch);
      q += hex;
    } else {
      q += static_cast<char>(ch);
    }
  }
  *cut = text[n] != '\0';
  return q;
}

// A value as it goes into an error line: escaped and shortened, in double quotes.
std::string quote(const char* text) {
  bool cut = false;
  std::string q = "\"" + escape(text, &cut) + "\"";
  return cut ? q + "..." : q;
}

std::string invalid_line(const ConfigVar& row, const char* text) {
  return std::string(row.name) + "=" + quote(text) + " is invalid (accepted: " + row.values +
         "); using the default " + quote(row.def);
}

// GFM table cells: '|' would end the cell, even inside a code span.
std::string markdown_cell(const char* text) {
  std::string out;
  for (const char* p = text; *p != '\0'; ++p) {
    if (*p == '|') out += '\\';
    out += *p;
  }
  return out;
}

}  // namespace

std::string quoted(const char* text) { return quote(text); }

const std::vector<ConfigVar>& config_table() {
  static const std::vector<ConfigVar> kTable = [] {
    std::vector<ConfigVar> rows;
    for (const VarSpec& s : specs()) rows.push_back(s.row);
    return rows;
  }();
  return kTable;
}

std::string config_table_markdown() {
  std::string md = "| Variable | Meaning | Values | Default |\n|---|---|---|---|\n";
  for (const ConfigVar& v : config_table()) {
    std::string def = v.def[0] != '\0' ? "`" + markdown_cell(v.def) + "`" : "unset";
    // Word lists are literal text to type; the other value descriptions are prose.
    bool words = std::strcmp(v.type, "bool") == 0 || std::strcmp(v.type, "enum") == 0;
    std::string values = words ? "`" + markdown_cell(v.values) + "`" : markdown_cell(v.values);
    md += "| `" + std::string(v.name) + "` | " + markdown_cell(v.meaning) + " | " + values + " | " +
          def + " |\n";
  }
  return md;
}

const std::vector<const char*>& nccl_var_names() {
  static const std::vector<const char*> kNames = {kNcclDebugVar, kNcclDebugFileVar};
  return kNames;
}

bool log_level_for_nccl_debug(const char* text, LogLevel* out) {
  const NcclDebugWord* w = nccl_debug_word(text);
  if (w == nullptr) return false;
  *out = w->level;
  return true;
}

Config parse_config(const EnvLookup& getenv_fn) {
  Config c;
  auto lookup = [&getenv_fn](const char* name) { return getenv_fn ? getenv_fn(name) : nullptr; };
  bool log_set = false;
  for (const VarSpec& s : specs()) {
    const char* text = lookup(s.row.name);
    if (text == nullptr) continue;
    // Set counts, valid or not: a bad ZEROCTA_LOG keeps the default its error line names.
    if (std::strcmp(s.row.name, kLogVar) == 0) log_set = true;
    if (!s.apply(text, &c)) {
      c.errors.push_back(invalid_line(s.row, text));
      continue;
    }
  }
  // Logging like NCCL: its level while ZEROCTA_LOG is unset, and its file.
  const char* nccl_debug = lookup(kNcclDebugVar);
  if (!log_set && log_level_for_nccl_debug(nccl_debug, &c.log)) c.log_from_nccl_debug = true;
  const NcclDebugWord* w = nccl_debug_word(nccl_debug);
  c.nccl_writes_log_file = w != nullptr && w->nccl_opens_file;
  if (const char* file = lookup(kNcclDebugFileVar)) c.log_file = file;
  c.fingerprint = config_fingerprint(c);
  return c;
}

const Config& config() {
  // A function-local static: initialized once, thread-safe, and never from a constructor.
  static const Config kConfig = parse_config([](const char* name) { return std::getenv(name); });
  return kConfig;
}

uint64_t config_fingerprint(const Config& c) {
  // The canonical text uses the enum words and plain byte counts, so "16M" and "16777216"
  // hash alike, and the version tag lets a protocol change make old and new ranks differ.
  std::string canon = "zerocta-config-v3";
  canon += " enable=" + std::to_string(c.enable ? 1 : 0);
  canon += " cta_policy=" + std::string(to_string(c.cta_policy));
  canon += " allgather=" + std::string(to_string(c.allgather));
  canon += " min_bytes=" + std::to_string(c.min_bytes);
  canon += " auto_max_ranks=" + std::to_string(c.auto_max_ranks);
  canon += " reducescatter=" + std::string(to_string(c.reducescatter));
  canon += " rs_scratch_bytes=" + std::to_string(c.rs_scratch_bytes);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis
  for (unsigned char ch : canon) {
    h ^= ch;
    h *= 0x100000001b3ull;  // FNV-1a 64-bit prime
  }
  return h;
}

const std::vector<const char*>& tool_var_names() {
  static const std::vector<const char*> kNames = {
      "ZEROCTA_LIB",
      // The example scripts' own (LD_PRELOAD-examples/README.md): the scripts keep them out of
      // their ranks, but a shell that exports one (tests/gpu/run_pending.sh: ZEROCTA_BUILD)
      // hands it to every other process it starts, and that is no misspelt setting.
      "ZEROCTA_BUILD", "ZEROCTA_RUN", "ZEROCTA_RUN_ARGS", "ZEROCTA_FSDP_ALLGATHER",
      "ZEROCTA_PAIR_ALLGATHER", "ZEROCTA_PAIR_ARGS", "ZEROCTA_FSDP_REDUCESCATTER",
      "ZEROCTA_PAIR_REDUCESCATTER"};
  return kNames;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance over three rows of the dynamic-programming table.
  auto lower = [](char ch) {
    return ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
  };
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const bool same = lower(a[i - 1]) == lower(b[j - 1]);
      size_t best = std::min(std::min(prev[j] + 1, cur[j - 1] + 1), prev[j - 1] + (same ? 0 : 1));
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1]))
        best = std::min(best, before[j - 2] + 1);
      cur[j] = best;
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<UnknownVar> find_unknown_vars(const char* const* envp) {
  static constexpr char kPrefix[] = "ZEROCTA_";
  std::vector<UnknownVar> out;
  if (envp == nullptr) return out;
  for (const char* const* e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    const std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    bool known = false;
    for (const ConfigVar& v : config_table()) known = known || name == v.name;
    for (const char* tool : tool_var_names()) known = known || name == tool;
    for (const UnknownVar& seen : out) known = known || name == seen.name;
    if (known) continue;
    UnknownVar u;
    u.name = name;
    u.distance = SIZE_MAX;
    // Ties go to the first name of the table, as in tools/zerocta-run.
    for (const ConfigVar& v : config_table()) {
      const size_t d = edit_distance(name, v.name);
      if (d < u.distance) {
        u.distance = d;
        u.closest = v.name;
      }
    }
    out.push_back(u);
  }
  return out;
}

std::vector<UnknownVar> find_unknown_vars_in_environment() { return find_unknown_vars(environ); }

std::string unknown_var_line(const UnknownVar& u) {
  // A name is any bytes but '=' and NUL: escaped like a bad value, so the WARN stays one line.
  bool cut = false;
  std::string line = escape(u.name.c_str(), &cut);
  line += cut ? "... is not a zerocta variable and is ignored"
              : " is not a zerocta variable and is ignored";
  if (u.distance <= kSuggestDistance) return line + "; did you mean " + u.closest + "?";
  return line + " (the nearest zerocta variable is " + u.closest + ")";
}

bool parse_size(const char* text, uint64_t* out) {
  if (text == nullptr || out == nullptr) return false;
  const char* p = text;
  if (*p < '0' || *p > '9') return false;  // also rejects "", "-1", "+1", " 1"
  uint64_t value = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  unsigned shift = 0;
  if (*p != '\0') {
    switch (*p) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        return false;
    }
    // "KiB" spelled exactly; a bare lower-case letter is accepted, "kib" is not.
    bool upper = *p >= 'A' && *p <= 'Z';
    ++p;
    if (upper && p[0] == 'i' && p[1] == 'B') p += 2;
    if (*p != '\0') return false;
  }
  if (value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

bool parse_count(const char* text, uint64_t* out) {
  constexpr uint64_t kMaxCount = 1000000;
  if (text == nullptr || out == nullptr || *text == '\0') return false;
  uint64_t value = 0;
  for (const char* p = text; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return false;
    value = value * 10 + static_cast<uint64_t>(*p - '0');
    if (value > kMaxCount) return false;
  }
  *out = value;
  return true;
}

std::string format_size(uint64_t bytes) {
  static const struct {
    unsigned shift;
    char suffix;
  } kUnits[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
  if (bytes != 0) {
    for (const auto& u : kUnits) {
      uint64_t unit = 1ull << u.shift;
      if (bytes % unit == 0) return std::to_string(bytes >> u.shift) + u.suffix;
    }
  }
  return std::to_string(bytes);
}

const char* to_string(CtaPolicyMode m) {
  switch (m) {
    case CtaPolicyMode::kZero:
      return "zero";
    case CtaPolicyMode::kEfficiency:
      return "efficiency";
    case CtaPolicyMode::kDefault:
      return "default";
    case CtaPolicyMode::kKeep:
      return "keep";
  }
  return "unknown";
}

const char* to_string(RouteMode m) {
  switch (m) {
    case RouteMode::kAuto:
      return "auto";
    case RouteMode::kZerocta:
      return "zerocta";
    case RouteMode::kNccl:
      return "nccl";
    case RouteMode::kOff:
      return "off";
  }
  return "unknown";
}

const char* to_string(LogLevel l) {
  switch (l) {
    case LogLevel::kNone:
      return "none";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "unknown";
}

}  // namespace zc
