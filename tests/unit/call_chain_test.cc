// The call chain (src/route/call_chain.h): every rank that makes the same collective calls reaches the
// same value; one call more, fewer, reordered or different in what NCCL requires alike gives
// another; what may legally differ between ranks (send and receive, a custom reduction's
// handle) does not enter it.
#include "call_chain.h"

#include <gtest/gtest.h>

#include <vector>

namespace zc {
namespace {

ChainPoint after(const std::vector<ChainLink>& links) {
  CallChain c;
  for (const ChainLink& l : links) c.fold(l);
  return c.now();
}

bool same(const ChainPoint& a, const ChainPoint& b) {
  return a.calls == b.calls && a.hash == b.hash;
}

const ChainLink kGather{ChainedCall::kAllGather, 1024, ncclBfloat16};
const ChainLink kReduce{ChainedCall::kAllReduce, 1, ncclFloat, kNoRoot, ncclSum};

TEST(CallChain, FoldReturnsThePointBeforeTheCallAndCountsIt) {
  CallChain c;
  const ChainPoint start = c.now();
  EXPECT_EQ(start.calls, 0u);
  EXPECT_NE(start.hash, 0u) << "a chain of no calls must differ from a zeroed post";
  EXPECT_TRUE(same(c.fold(kGather), start));
  const ChainPoint one = c.now();
  EXPECT_EQ(one.calls, 1u);
  EXPECT_NE(one.hash, start.hash);
  EXPECT_TRUE(same(c.fold(ChainLink{}), one)) << "kNone (send, receive) is not folded";
  EXPECT_TRUE(same(c.now(), one));
}

TEST(CallChain, TheSameCallsGiveTheSameChainAndADriftAnother) {
  const ChainPoint base = after({kGather, kReduce, kGather});
  EXPECT_TRUE(same(after({kGather, kReduce, kGather}), base));
  EXPECT_FALSE(same(after({kGather, kGather}), base)) << "one call fewer";
  EXPECT_FALSE(same(after({kGather, kReduce, kReduce, kGather}), base)) << "one call more";
  EXPECT_FALSE(same(after({kReduce, kGather, kGather}), base)) << "reordered";
  // Every field NCCL requires alike on every rank enters it.
  ChainLink other = kReduce;
  other.count = 2;
  EXPECT_FALSE(same(after({kGather, other, kGather}), base)) << "count";
  other = kReduce;
  other.datatype = ncclHalf;
  EXPECT_FALSE(same(after({kGather, other, kGather}), base)) << "datatype";
  other = kReduce;
  other.op = ncclMax;
  EXPECT_FALSE(same(after({kGather, other, kGather}), base)) << "reduction";
  other = kReduce;
  other.call = ChainedCall::kReduceScatter;
  EXPECT_FALSE(same(after({kGather, other, kGather}), base)) << "collective";
  const ChainLink root0{ChainedCall::kBroadcast, 8, ncclInt8, 0};
  const ChainLink root1{ChainedCall::kBroadcast, 8, ncclInt8, 1};
  EXPECT_FALSE(same(after({root0}), after({root1}))) << "root";
  EXPECT_FALSE(same(after({kGather}), after({ChainLink{ChainedCall::kAllGather, 1024, ncclInt8}})))
      << "bytes";
}

// NCCL moves the data of an op that reduces nothing as bytes: the same bytes under another
// datatype is the same call; for a reduction the datatype is part of the op.
TEST(CallChain, OpsThatReduceNothingFoldTheirBytes) {
  const ChainLink halves{ChainedCall::kAllGather, 1024, ncclBfloat16};
  const ChainLink bytes{ChainedCall::kAllGather, 2048, ncclUint8};
  EXPECT_TRUE(same(after({halves}), after({bytes})));
  const ChainLink floats{ChainedCall::kAllReduce, 4, ncclFloat32, kNoRoot, ncclSum};
  const ChainLink ints{ChainedCall::kAllReduce, 4, ncclInt32, kNoRoot, ncclSum};
  EXPECT_FALSE(same(after({floats}), after({ints})));
}

TEST(CallChain, CustomReductionsFoldAlikeWhateverTheirHandles) {
  // ncclRedOpCreatePreMulSum hands each rank a handle of its own, so ranks' handles may differ.
  ChainLink a = kReduce, b = kReduce;
  a.op = ncclNumOps;
  b.op = ncclNumOps + 3;
  EXPECT_TRUE(same(after({a}), after({b})));
  EXPECT_FALSE(same(after({a}), after({kReduce}))) << "a custom reduction is not a sum";
}

}  // namespace
}  // namespace zc
