#include "config_bytes.h"

#include <cstdlib>
#include <cstring>

namespace itest {

int SeenConfig::int_at(size_t offset) const {
  int v = 0;
  if (offset + sizeof v <= bytes.size()) memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

unsigned long long SeenConfig::ptr_at(size_t offset) const {
  unsigned long long v = 0;
  if (offset + sizeof v <= bytes.size()) memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

int SeenConfig::cta() const { return int_at(kCtaOffset); }

SeenConfig seen_config(const RunResult& r, const std::string& fn) {
  SeenConfig s;
  std::vector<std::string> calls = log_calls(r, fn);
  if (calls.empty()) return s;
  s.present = true;
  auto f = log_fields(calls.front());
  if (f["config"] == "NULL") {
    s.null = true;
    return s;
  }
  s.ptr = f["config"];
  s.size = strtoull(f["config_size"].c_str(), nullptr, 10);
  s.magic = static_cast<unsigned>(strtoul(f["magic"].c_str(), nullptr, 0));
  s.version = static_cast<unsigned>(strtoul(f["version"].c_str(), nullptr, 10));
  s.bytes = unhex(f["hex"]);
  return s;
}

}  // namespace itest
