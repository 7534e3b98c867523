// Output digests for proving bitwise equality between a run with the shim and one without.
//
// When env ZCTEST_DIGEST_FILE names a file, each rank collects one line per checked output
// (FNV-1a 64 of the bytes) and writes them to "<file>.rank<r>.part"; after the ranks finish
// the parent appends the parts to the file in rank order, so two runs of the same binary give
// files that `diff` can compare line by line.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zgpu {

// Path from ZCTEST_DIGEST_FILE, "" when digests are off.
std::string digest_file();

class DigestLog {
 public:
  explicit DigestLog(int rank) : rank_(rank), enabled_(!digest_file().empty()) {}
  bool enabled() const { return enabled_; }
  // `label` identifies the output (test, op, type, size) and must not contain run-dependent
  // values such as pointers or timings.
  void add(const std::string& label, const void* host_bytes, size_t len);
  // Writes this rank's lines to its part file; throws RankError on failure.
  void flush();

 private:
  int rank_;
  bool enabled_;
  std::vector<std::string> lines_;
};

// Parent side, before a run: removes part files a previous, failed run may have left.
void digest_begin(int nranks);

// Parent side: appends the part files of ranks [0, nranks) to the digest file in rank order
// and removes them. Returns "" on success (or when digests are off), else an error message.
std::string digest_merge(int nranks);

}  // namespace zgpu
