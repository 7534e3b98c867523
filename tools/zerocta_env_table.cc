// zerocta-env-table: prints the ZEROCTA_* variable table (src/core/config.cc) as markdown, or
// rewrites it in place in a file between the README markers. The unit test
// EnvTableMarkdown.ReadmeHoldsTheCurrentTable fails until README.md matches this output.
//
//   zerocta-env-table                   print the table to stdout
//   zerocta-env-table --update FILE     replace the lines between the markers in FILE
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "config.h"

namespace {

constexpr const char* kBeginMarker = "<!-- zerocta-env-table:begin -->";
constexpr const char* kEndMarker = "<!-- zerocta-env-table:end -->";

int usage() {
  std::fprintf(stderr,
               "usage: zerocta-env-table              print the ZEROCTA_* table (markdown)\n"
               "       zerocta-env-table --update FILE  rewrite it between the lines\n"
               "                                        %s and %s\n",
               kBeginMarker, kEndMarker);
  return 2;
}

// Replaces whatever is between the marker lines with a blank line, the table and a blank
// line. Writes a sibling temporary file and renames it, so a failure leaves FILE intact.
int update(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "zerocta-env-table: cannot read %s\n", path);
    return 1;
  }
  std::string out, line;
  enum { kBefore, kInside, kAfter } state = kBefore;
  while (std::getline(in, line)) {
    if (state == kBefore && line == kBeginMarker) {
      out += line + "\n\n" + zc::config_table_markdown() + "\n";
      state = kInside;
    } else if (state == kInside) {
      if (line == kEndMarker) {
        out += line + "\n";
        state = kAfter;
      }
    } else {
      out += line + "\n";
    }
  }
  if (state != kAfter) {
    std::fprintf(stderr,
                 "zerocta-env-table: %s lacks the lines\n%s\n%s\n(add them where the "
                 "table belongs)\n",
                 path, kBeginMarker, kEndMarker);
    return 1;
  }
  std::string tmp = std::string(path) + ".zerocta-env-table.tmp";
  {
    std::ofstream o(tmp, std::ios::trunc);
    o << out;
    if (!o.flush()) {
      std::fprintf(stderr, "zerocta-env-table: cannot write %s\n", tmp.c_str());
      std::remove(tmp.c_str());
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), path) != 0) {
    std::fprintf(stderr, "zerocta-env-table: cannot replace %s: %s\n", path, std::strerror(errno));
    std::remove(tmp.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) {
    std::fputs(zc::config_table_markdown().c_str(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  if (argc == 3 && std::strcmp(argv[1], "--update") == 0) return update(argv[2]);
  return usage();
}
