// libFuzzer target: arbitrary bytes as the values of every ZEROCTA_* variable and as a size.
// Besides "no crash, no sanitizer report", it checks parse_config against an independent
// oracle built here from the table's accepted values:
//   - the fuzzer reads exactly the variables of config_table(), no more, no fewer;
//   - a value is rejected exactly when the oracle says it is bad, with exactly one line;
//   - every line is one line of printable ASCII naming its variable;
//   - accepted values land in their fields; parse_size agrees with a reference parser and
//     format_size/parse_size round-trip;
//   - the same fields as ZEROCTA_<field> names: find_unknown_vars reports exactly the unknown
//     ones, each with its nearest known name, on one printable line.
//
// Input layout: 2 bytes = bit mask of which variables are set (in config_table() order),
// then '\0'-separated values, one per variable, then one more value for parse_size.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "config.h"

namespace {

void check(bool ok, const char* what, const std::string& detail) {
  if (ok) return;
  std::fprintf(stderr, "config_fuzz invariant broken: %s\n  %s\n", what, detail.c_str());
  std::abort();
}

std::string lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

bool is_word_of(const std::string& value, const char* values) {
  std::string v = lower(value);
  std::string all = values;
  size_t start = 0;
  while (true) {
    size_t bar = all.find('|', start);
    if (all.substr(start, bar == std::string::npos ? std::string::npos : bar - start) == v) {
      return true;
    }
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

// Reference size parser, written differently from parse_size: split digits and suffix,
// look the suffix up, multiply in 128 bits.
bool reference_size(const std::string& text, uint64_t* out) {
  size_t n = 0;
  while (n < text.size() && text[n] >= '0' && text[n] <= '9') ++n;
  if (n == 0) return false;
  static const std::map<std::string, unsigned> kShift = {
      {"", 0},   {"K", 10}, {"M", 20},   {"G", 30},   {"T", 40},   {"k", 10},   {"m", 20},
      {"g", 30}, {"t", 40}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40},
  };
  auto it = kShift.find(text.substr(n));
  if (it == kShift.end()) return false;
  unsigned __int128 v = 0;
  for (size_t i = 0; i < n; ++i) {
    v = v * 10 + static_cast<unsigned>(text[i] - '0');
    if (v > UINT64_MAX) return false;  // stays > UINT64_MAX once it is
  }
  v <<= it->second;
  if (v > UINT64_MAX) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// Reference count parser: decimal digits (leading zeros allowed, as for sizes), value at
// most 1000000.
bool reference_count(const std::string& text, uint64_t* out) {
  if (text.empty()) return false;
  uint64_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
    if (v > 1000000) return false;  // stays above once it is
  }
  *out = v;
  return true;
}

using FieldReader = std::string (*)(const zc::Config&);

// Each variable's field as text, to compare an accepted value with what was stored.
const std::map<std::string, FieldReader>& field_readers() {
  static const std::map<std::string, FieldReader> kFields = {
      {"ZEROCTA_ENABLE", [](const zc::Config& c) { return std::to_string(c.enable); }},
      {"ZEROCTA_STRICT", [](const zc::Config& c) { return std::to_string(c.strict); }},
      {"ZEROCTA_LOG", [](const zc::Config& c) { return std::string(zc::to_string(c.log)); }},
      {"ZEROCTA_CTA_POLICY",
       [](const zc::Config& c) { return std::string(zc::to_string(c.cta_policy)); }},
      {"ZEROCTA_CTA_POLICY_FORCE",
       [](const zc::Config& c) { return std::to_string(c.cta_policy_force); }},
      {"ZEROCTA_ALLGATHER",
       [](const zc::Config& c) { return std::string(zc::to_string(c.allgather)); }},
      {"ZEROCTA_MIN_BYTES", [](const zc::Config& c) { return std::to_string(c.min_bytes); }},
      {"ZEROCTA_AUTO_MAX_RANKS",
       [](const zc::Config& c) { return std::to_string(c.auto_max_ranks); }},
      {"ZEROCTA_REDUCESCATTER",
       [](const zc::Config& c) { return std::string(zc::to_string(c.reducescatter)); }},
      {"ZEROCTA_RS_SCRATCH",
       [](const zc::Config& c) { return std::to_string(c.rs_scratch_bytes); }},
      {"ZEROCTA_RS_CTAS", [](const zc::Config& c) { return std::to_string(c.rs_ctas); }},
      {"ZEROCTA_STATS", [](const zc::Config& c) { return c.stats; }},
      {"ZEROCTA_NVTX", [](const zc::Config& c) { return std::to_string(c.nvtx); }},
      {"ZEROCTA_NCCL_LIBRARY", [](const zc::Config& c) { return c.nccl_library; }},
      {"ZEROCTA_CHANNEL_DIR", [](const zc::Config& c) { return c.channel_dir; }},
  };
  return kFields;
}

// The readers name exactly the table's variables: a new variable must be taught to the
// fuzzer, and a removed one must leave it.
void check_readers_match_the_table() {
  std::vector<std::string> table_names, reader_names;
  for (const zc::ConfigVar& v : zc::config_table()) table_names.push_back(v.name);
  for (const auto& reader : field_readers()) reader_names.push_back(reader.first);
  std::sort(table_names.begin(), table_names.end());
  std::string listed;
  for (const std::string& name : reader_names) listed += name + " ";
  check(table_names == reader_names, "the fuzzer's variables are not config_table()'s", listed);
}

std::string field_text(const zc::Config& c, const std::string& name) {
  auto it = field_readers().find(name);
  check(it != field_readers().end(), "a table variable unknown to the fuzzer", name);
  return it->second(c);
}

// What the stored field should read as for an accepted value.
std::string expected_text(const zc::ConfigVar& v, const std::string& value) {
  std::string type = v.type;
  if (type == "bool") return is_word_of(value, "1|true|yes|on") ? "1" : "0";
  if (type == "enum") return lower(value);
  if (type == "size") {
    uint64_t n = 0;
    reference_size(value, &n);
    return std::to_string(n);
  }
  if (type == "count") {
    uint64_t n = 0;
    reference_count(value, &n);
    return std::to_string(n);
  }
  return value;
}

void check_size(const std::string& text) {
  uint64_t got = 0xdeadbeef, want = 0;
  bool ok = zc::parse_size(text.c_str(), &got);
  bool ref = reference_size(text, &want);
  check(ok == ref, "parse_size accepts exactly what the reference accepts", text);
  if (!ok) {
    check(got == 0xdeadbeef, "a failed parse_size leaves the output alone", text);
    return;
  }
  check(got == want, "parse_size value equals the reference", text);
  uint64_t back = 0;
  std::string formatted = zc::format_size(got);
  check(zc::parse_size(formatted.c_str(), &back) && back == got, "format_size round-trips",
        formatted);
}

// An error line split at its first quoted value: NAME="escaped value"[...]rest.
struct ErrorLine {
  std::string name;
  std::string value;  // unescaped
  bool shortened = false;
  std::string rest;
};

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

// Splits a line the way a reader would; false if the quoting is malformed (a value that
// could end the quotes early or break the line would make the line ambiguous).
bool split_line(const std::string& line, ErrorLine* out) {
  size_t eq = line.find("=\"");
  if (eq == std::string::npos) return false;
  out->name = line.substr(0, eq);
  size_t i = eq + 2;
  for (; i < line.size() && line[i] != '"'; ++i) {
    if (line[i] != '\\') {
      out->value += line[i];
      continue;
    }
    if (i + 1 >= line.size()) return false;
    char esc = line[++i];
    if (esc == '"' || esc == '\\') {
      out->value += esc;
    } else if (esc == 'x' && i + 2 < line.size() && hex_digit(line[i + 1]) >= 0 &&
               hex_digit(line[i + 2]) >= 0) {
      out->value += static_cast<char>(hex_digit(line[i + 1]) * 16 + hex_digit(line[i + 2]));
      i += 2;
    } else {
      return false;
    }
  }
  if (i >= line.size()) return false;
  out->rest = line.substr(i + 1);
  if (out->rest.rfind("...", 0) == 0) {
    out->shortened = true;
    out->rest = out->rest.substr(3);
  }
  return true;
}

}  // namespace

// The fields as environment entries "ZEROCTA_<field>": find_unknown_vars against a direct
// reading of its contract, and unknown_var_line stays one printable line.
void check_unknown_vars(const std::vector<std::string>& fields) {
  const std::vector<zc::ConfigVar>& table = zc::config_table();
  std::vector<std::string> entries;
  for (const std::string& f : fields) entries.push_back("ZEROCTA_" + f);
  std::vector<const char*> envp;
  for (const std::string& e : entries) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  const std::vector<zc::UnknownVar> unknown = zc::find_unknown_vars(envp.data());
  std::vector<std::string> expected;
  for (const std::string& e : entries) {
    const std::string name = e.substr(0, e.find('='));
    bool known = false;
    for (const zc::ConfigVar& v : table) known = known || name == v.name;
    for (const char* t : zc::tool_var_names()) known = known || name == t;
    for (const std::string& seen : expected) known = known || name == seen;
    if (!known) expected.push_back(name);
  }
  check(unknown.size() == expected.size(), "find_unknown_vars: count",
        std::to_string(unknown.size()));
  for (size_t i = 0; i < unknown.size(); ++i) {
    const zc::UnknownVar& u = unknown[i];
    check(u.name == expected[i], "find_unknown_vars: name/order", u.name);
    size_t best = SIZE_MAX;
    for (const zc::ConfigVar& v : table) best = std::min(best, zc::edit_distance(u.name, v.name));
    check(u.distance == best && zc::edit_distance(u.name, u.closest) == best,
          "find_unknown_vars: not the nearest name", u.name + " -> " + u.closest);
    const std::string line = zc::unknown_var_line(u);
    bool printable = line.size() < 400;
    for (char ch : line) printable = printable && ch >= 0x20 && ch < 0x7f;
    check(printable, "unknown_var_line: not one short printable line", line);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool kReadersChecked = (check_readers_match_the_table(), true);
  (void)kReadersChecked;
  const std::vector<zc::ConfigVar>& table = zc::config_table();
  uint32_t mask = 0;
  if (size >= 2) {
    mask = data[0] | (static_cast<uint32_t>(data[1]) << 8);
    data += 2;
    size -= 2;
  }
  std::vector<std::string> fields(table.size() + 1);
  for (size_t i = 0, f = 0; i < size && f < fields.size(); ++i) {
    if (data[i] == '\0') {
      ++f;
    } else {
      fields[f] += static_cast<char>(data[i]);
    }
  }

  std::map<std::string, std::string> env;
  for (size_t i = 0; i < table.size(); ++i) {
    if (mask & (1u << i)) env[table[i].name] = fields[i];
  }
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  zc::Config c = zc::parse_config(lookup);
  check_unknown_vars(fields);

  // The oracle's view: which values are bad.
  zc::Config defaults;
  size_t expected_errors = 0;
  std::map<std::string, bool> bad;
  for (const zc::ConfigVar& v : table) {
    auto it = env.find(v.name);
    if (it == env.end()) continue;
    const std::string& value = it->second;
    std::string type = v.type, name = v.name;
    bool good = true;
    uint64_t n = 0;
    if (type == "bool" || type == "enum") good = is_word_of(value, v.values);
    if (type == "size") good = reference_size(value, &n);
    if (type == "count") good = reference_count(value, &n);
    if (name == "ZEROCTA_CHANNEL_DIR") good = !value.empty();  // a directory must be named
    bad[name] = !good;
    expected_errors += good ? 0 : 1;
  }
  check(c.errors.size() == expected_errors, "one line per bad value",
        std::to_string(c.errors.size()) + " lines, expected " + std::to_string(expected_errors));

  std::map<std::string, size_t> invalid_lines;
  for (const std::string& line : c.errors) {
    for (char ch : line) check(ch >= 0x20 && ch < 0x7f, "error lines are printable ASCII", line);
    ErrorLine e;
    check(split_line(line, &e), "error lines start with NAME=\"escaped value\"", line);
    check(e.rest.rfind(" is invalid (accepted: ", 0) == 0, "every line is an invalid line", line);
    auto it = env.find(e.name);
    check(it != env.end(), "an invalid line names a variable that is set", line);
    // The line quotes the value, shortened only when it is long.
    const std::string& value = it->second;
    check(e.shortened ? value.size() > e.value.size() && value.rfind(e.value, 0) == 0
                      : value == e.value,
          "the line quotes the bad value", line);
    ++invalid_lines[e.name];
  }
  for (const zc::ConfigVar& v : table) {
    auto it = bad.find(v.name);
    bool is_bad = it != bad.end() && it->second;
    check(invalid_lines[v.name] == (is_bad ? 1u : 0u), "exactly one invalid line per bad variable",
          v.name);

    std::string name = v.name;
    if (it == bad.end() || is_bad) {
      check(field_text(c, name) == field_text(defaults, name), "unset/bad values keep defaults",
            name);
    } else {
      check(field_text(c, name) == expected_text(v, env[name]), "accepted values are stored",
            name + "=" + env[name]);
    }
  }

  check(c.fingerprint == zc::config_fingerprint(c), "fingerprint is the config's", "");
  zc::Config again = zc::parse_config(lookup);
  check(again.fingerprint == c.fingerprint && again.errors == c.errors, "parsing is pure", "");

  check_size(fields.back());
  for (size_t i = 0; i < table.size(); ++i) check_size(fields[i]);
  return 0;
}
