// The routing predicates (route.h): every combination of their inputs against the
// rules written out independently below, and the NCCL datatype sizes.
#include "route.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace {

using zc::RouteDecision;
using zc::RouteInputs;
using zc::RouteKind;
using zc::RouteMode;

// The documented rules, as a decision list:
//  1. only auto and zerocta ask for the copy-engine route;
//  2. an op whose size is unknown (bad datatype / overflow) or empty: NCCL decides;
//  3. the route needs the communicator's agreement (every rank joined with equal settings);
//  4. zerocta then takes every op, auto those on up to auto_max_ranks ranks from min_bytes up.
RouteKind expected_route(const RouteInputs& in) {
  const bool ours = in.mode == RouteMode::kAuto || in.mode == RouteMode::kZerocta;
  if (!ours || !in.bytes_valid || in.total_bytes == 0 || !in.committed)
    return RouteKind::kPassthrough;
  if (in.mode == RouteMode::kZerocta) return RouteKind::kCe;
  if (in.auto_max_ranks != 0 && static_cast<uint64_t>(in.nranks) > in.auto_max_ranks)
    return RouteKind::kPassthrough;
  return in.total_bytes >= in.min_bytes ? RouteKind::kCe : RouteKind::kPassthrough;
}

constexpr RouteMode kModes[] = {RouteMode::kAuto, RouteMode::kZerocta, RouteMode::kNccl,
                                RouteMode::kOff};
constexpr uint64_t kMin = 16ull << 20;

TEST(Route, TruthTable) {
  static const char kWhyNot[] = "not every rank joined (test reason)";
  int cases = 0;
  for (RouteMode mode : kModes)
    for (bool committed : {false, true})
      for (uint64_t total : {uint64_t{0}, uint64_t{1}, kMin - 1, kMin, kMin + 1, UINT64_MAX})
        for (bool bytes_valid : {false, true})
          for (int nranks : {2, 4, 5}) {
            RouteInputs in;
            in.mode = mode;
            in.committed = committed;
            in.why_not = kWhyNot;
            in.total_bytes = total;
            in.bytes_valid = bytes_valid;
            in.min_bytes = kMin;
            in.nranks = nranks;
            in.auto_max_ranks = 4;  // a communicator committed for another setting's sake
            const RouteDecision d = zc::choose_allgather_route(in);
            SCOPED_TRACE(std::string("mode ") + zc::to_string(mode) + " committed " +
                         std::to_string(committed) + " total " + std::to_string(total) +
                         " bytes_valid " + std::to_string(bytes_valid) + " nranks " +
                         std::to_string(nranks));
            EXPECT_EQ(d.route, expected_route(in));
            ASSERT_NE(d.why, nullptr);
            EXPECT_GT(strlen(d.why), 0u);
            // When the only obstacle is the missing agreement, the log says why it is missing.
            RouteInputs agreed = in;
            agreed.committed = true;
            if (!committed && expected_route(agreed) == RouteKind::kCe) {
              EXPECT_STREQ(d.why, kWhyNot);
            }
            ++cases;
          }
  EXPECT_EQ(cases, 4 * 2 * 6 * 2 * 3);
}

TEST(Route, MinBytesBoundaryIsInclusiveForAuto) {
  RouteInputs in;
  in.mode = RouteMode::kAuto;
  in.committed = true;
  in.min_bytes = 4096;
  in.total_bytes = 4095;
  EXPECT_EQ(zc::choose_allgather_route(in).route, RouteKind::kPassthrough);
  in.total_bytes = 4096;
  EXPECT_EQ(zc::choose_allgather_route(in).route, RouteKind::kCe);
  in.min_bytes = 0;  // ZEROCTA_MIN_BYTES=0: every non-empty all-gather
  in.total_bytes = 1;
  EXPECT_EQ(zc::choose_allgather_route(in).route, RouteKind::kCe);
  in.total_bytes = 0;
  EXPECT_EQ(zc::choose_allgather_route(in).route, RouteKind::kPassthrough);
}

TEST(Route, WhyIsNeverEmptyEvenWithoutAReasonForTheMissingAgreement) {
  // The reason is logged with %s: an empty or NULL why_not must not become the log line.
  for (const char* why_not : {static_cast<const char*>(""), static_cast<const char*>(nullptr)}) {
    RouteInputs in;
    in.mode = RouteMode::kAuto;
    in.why_not = why_not;
    in.total_bytes = 1ull << 30;
    in.min_bytes = kMin;
    const RouteDecision d = zc::choose_allgather_route(in);
    EXPECT_EQ(d.route, RouteKind::kPassthrough);
    ASSERT_NE(d.why, nullptr) << "why_not " << (why_not ? "\"\"" : "NULL");
    EXPECT_GT(strlen(d.why), 0u) << "why_not \"\"";
  }
}

TEST(Route, NcclTypeSizes) {
  struct {
    int type;
    uint64_t bytes;
  } const table[] = {
      {ncclInt8, 1},    {ncclUint8, 1},    {ncclInt32, 4},      {ncclUint32, 4},
      {ncclInt64, 8},   {ncclUint64, 8},   {ncclFloat16, 2},    {ncclFloat32, 4},
      {ncclFloat64, 8}, {ncclBfloat16, 2}, {ncclFloat8e4m3, 1}, {ncclFloat8e5m2, 1},
  };
  static_assert(sizeof(table) / sizeof(table[0]) == ncclNumTypes, "one row per NCCL type");
  for (const auto& row : table) EXPECT_EQ(zc::nccl_type_size(row.type), row.bytes) << row.type;
  // Aliases are the same types.
  EXPECT_EQ(zc::nccl_type_size(ncclChar), 1u);
  EXPECT_EQ(zc::nccl_type_size(ncclInt), 4u);
  EXPECT_EQ(zc::nccl_type_size(ncclHalf), 2u);
  EXPECT_EQ(zc::nccl_type_size(ncclFloat), 4u);
  EXPECT_EQ(zc::nccl_type_size(ncclDouble), 8u);
  // Unknown types: 0, so the route passes them to NCCL to reject.
  for (int bad : {static_cast<int>(ncclNumTypes), -1, 255, 1 << 20})
    EXPECT_EQ(zc::nccl_type_size(bad), 0u) << bad;
}

}  // namespace

// ---- the reduce-scatter's predicate ----

using zc::RsRouteInputs;

// Its documented rules, as a decision list: auto or zerocta; float, half or bfloat16; sum,
// average or a pre-multiplied sum made for the op's datatype; a known, non-empty size; the
// agreement; 2 to 8 ranks (the kernel's sources), every rank with a scratch that holds a slice;
// then zerocta takes every op, auto those on up to auto_max_ranks ranks from min_bytes up.
RouteKind expected_rs_route(const RsRouteInputs& in) {
  const bool ours = in.mode == RouteMode::kAuto || in.mode == RouteMode::kZerocta;
  const bool type =
      in.datatype == ncclFloat32 || in.datatype == ncclFloat16 || in.datatype == ncclBfloat16;
  const bool op = in.reduce == zc::RsReduce::kSum || in.reduce == zc::RsReduce::kAvg ||
                  (in.reduce == zc::RsReduce::kPreMulSum && in.scalar_datatype == in.datatype);
  if (!ours || !type || !op || !in.bytes_valid || in.total_bytes == 0 || !in.committed ||
      in.nranks < 2 || in.nranks > 8 || !in.every_scratch || in.slice == 0)
    return RouteKind::kPassthrough;
  if (in.mode == RouteMode::kZerocta) return RouteKind::kCe;
  if (in.auto_max_ranks != 0 && static_cast<uint64_t>(in.nranks) > in.auto_max_ranks)
    return RouteKind::kPassthrough;
  return in.total_bytes >= in.min_bytes ? RouteKind::kCe : RouteKind::kPassthrough;
}

TEST(ReduceScatterRoute, TruthTable) {
  int cases = 0;
  for (RouteMode mode : kModes)
    for (int datatype : {ncclFloat32, ncclFloat16, ncclBfloat16, ncclFloat64, ncclInt32})
      for (zc::RsReduce reduce :
           {zc::RsReduce::kSum, zc::RsReduce::kAvg, zc::RsReduce::kPreMulSum, zc::RsReduce::kOther})
        for (int scalar_datatype : {ncclFloat32, ncclBfloat16})  // a pre-multiplied sum's
          for (bool committed : {false, true})
            for (bool every_scratch : {false, true})
              for (int nranks : {1, 2, 3, 8, 9})
                for (uint64_t bytes : {uint64_t{0}, kMin - 1, kMin})
                  for (uint64_t slice : {uint64_t{0}, uint64_t{4096}}) {
                    RsRouteInputs in;
                    in.mode = mode;
                    in.committed = committed;
                    in.why_not = committed ? "" : "not agreed (test reason)";
                    in.every_scratch = every_scratch;
                    in.nranks = nranks;
                    in.datatype = datatype;
                    in.reduce = reduce;
                    in.scalar_datatype = scalar_datatype;
                    in.total_bytes = bytes;
                    in.min_bytes = kMin;
                    in.auto_max_ranks = 2;
                    in.slice = slice;
                    const RouteDecision d = zc::choose_reduce_scatter_route(in);
                    ASSERT_EQ(d.route, expected_rs_route(in))
                        << "mode " << static_cast<int>(mode) << " type " << datatype << " op "
                        << static_cast<int>(reduce) << " scalar " << scalar_datatype
                        << " committed " << committed << " scratch " << every_scratch << " ranks "
                        << nranks << " bytes " << bytes << " slice " << slice;
                    ASSERT_NE(d.why, nullptr);
                    ASSERT_GT(std::strlen(d.why), 0u);
                    ++cases;
                  }
  EXPECT_EQ(cases, 4 * 5 * 4 * 2 * 2 * 2 * 5 * 3 * 2);
}
