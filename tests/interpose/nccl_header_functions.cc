#include "nccl_header_functions.h"

#include <regex>

#include "harness.h"

namespace itest {
namespace {

// Blanks out comments, string/char literals and preprocessor directives (with their
// continuation lines), keeping everything else, so that only declarations remain.
std::string code_only(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  bool line_start = true;
  for (size_t i = 0; i < src.size();) {
    char c = src[i];
    if (line_start && (c == ' ' || c == '\t')) {
      out += c;
      ++i;
      continue;
    }
    if (line_start && c == '#') {
      // Skip to the end of the directive, honouring backslash-newline continuations.
      while (i < src.size() && !(src[i] == '\n' && src[i - 1] != '\\')) ++i;
      continue;
    }
    line_start = false;
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      size_t end = src.find("*/", i + 2);
      i = end == std::string::npos ? src.size() : end + 2;
      out += ' ';
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      char quote = c;
      for (++i; i < src.size() && src[i] != quote; ++i)
        if (src[i] == '\\') ++i;
      ++i;
      out += ' ';
    } else {
      if (c == '\n') line_start = true;
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

std::set<std::string> nccl_header_functions(const std::string& header_path,
                                            const std::string& prefix) {
  std::set<std::string> names;
  const std::string code = code_only(read_file(header_path));
  const std::regex kDecl("\\b(" + prefix + "[A-Za-z0-9_]*)\\s*\\(");
  for (std::sregex_iterator it(code.begin(), code.end(), kDecl), end; it != end; ++it)
    names.insert((*it)[1].str());
  return names;
}

}  // namespace itest
