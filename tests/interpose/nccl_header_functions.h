// The ncclX functions declared by an nccl.h, read from the header text itself so that a
// function added in a newer NCCL shows up without anyone updating a list.
#pragma once

#include <set>
#include <string>

namespace itest {

// Every `ncclName(` declared outside comments, strings and preprocessor lines (pncclX are
// not included). Empty when the file cannot be read.
// `prefix` selects the family: "nccl" for nccl.h, "zerocta_" for zerocta.h.
std::set<std::string> nccl_header_functions(const std::string& header_path,
                                            const std::string& prefix = "nccl");

}  // namespace itest
