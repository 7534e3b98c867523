#include "digest.h"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

std::string part_path(int rank) { return digest_file() + ".rank" + std::to_string(rank) + ".part"; }

}  // namespace

std::string digest_file() {
  const char* path = getenv("ZCTEST_DIGEST_FILE");
  return path ? path : "";
}

void DigestLog::add(const std::string& label, const void* host_bytes, size_t len) {
  if (!enabled_) return;
  char hex[32];
  snprintf(hex, sizeof(hex), "%016" PRIx64, fnv1a64(host_bytes, len));
  lines_.push_back(label + " rank=" + std::to_string(rank_) + " bytes=" + std::to_string(len) +
                   " fnv1a64=" + hex + "\n");
}

void DigestLog::flush() {
  if (!enabled_) return;
  const std::string path = part_path(rank_);
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) fail("cannot write " + path + ": " + strerror(errno));
  for (const auto& line : lines_) fputs(line.c_str(), f);
  if (fclose(f) != 0) fail("cannot write " + path + ": " + strerror(errno));
  lines_.clear();
}

void digest_begin(int nranks) {
  if (digest_file().empty()) return;
  for (int r = 0; r < nranks; ++r) unlink(part_path(r).c_str());
}

std::string digest_merge(int nranks) {
  const std::string path = digest_file();
  if (path.empty()) return "";
  FILE* out = fopen(path.c_str(), "a");
  if (out == nullptr) return "cannot append to " + path + ": " + strerror(errno);
  std::string error;
  for (int r = 0; r < nranks; ++r) {
    const std::string part = part_path(r);
    FILE* in = fopen(part.c_str(), "r");
    if (in == nullptr) {
      // A rank that failed before writing its digests: the run fails anyway; note it in the
      // file so a diff shows the gap instead of silently shorter output.
      fprintf(out, "MISSING digests of rank %d\n", r);
      if (error.empty()) error = "missing " + part;
      continue;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    unlink(part.c_str());
  }
  if (fclose(out) != 0 && error.empty()) error = "cannot write " + path;
  return error;
}

}  // namespace zgpu
