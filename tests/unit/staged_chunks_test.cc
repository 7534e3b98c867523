// The chunking of the nccl-staged route (staged_allgather.h): every byte of a rank's chunk
// goes through exactly once, in order, nranks chunks always fit in the staging area, and the
// staging areas of eager and captured ops never overlap.
#include <gtest/gtest.h>

#include <cstdint>

#include "ce_plan.h"
#include "staged_allgather.h"

namespace {

TEST(StagedChunks, CoverEveryByteOnceAndFitTheStagingArea) {
  const uint64_t kStaging[] = {1, 4095, 4096, 64 << 10, (256 << 20) + 7, 768ull << 20};
  const uint64_t kPerRank[] = {1, 3, 4095, 4096, 4097, (1 << 20) + 1, 96ull << 20, 1ull << 30};
  int checked = 0;
  for (int n : {1, 2, 3, 4, 8, 64})
    for (uint64_t staging : kStaging)
      for (uint64_t per_rank : kPerRank) {
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " staging " << staging << " per_rank " << per_rank);
        const uint64_t fit = staging / static_cast<uint64_t>(n);
        if (fit == 0) {
          EXPECT_TRUE(zc::staged_chunks(per_rank, n, staging).empty());
          continue;
        }
        if (per_rank / fit > 100000) continue;  // correct, but millions of chunks to check
        auto chunks = zc::staged_chunks(per_rank, n, staging);
        ASSERT_FALSE(chunks.empty());
        uint64_t next = 0;
        for (size_t i = 0; i < chunks.size(); ++i) {
          EXPECT_EQ(chunks[i].offset, next);
          EXPECT_GT(chunks[i].bytes, 0u);
          EXPECT_LE(chunks[i].bytes * static_cast<uint64_t>(n), staging);
          // Full chunks are page multiples whenever a page fits: the copies stay aligned.
          if (i + 1 < chunks.size() && staging / static_cast<uint64_t>(n) >= 4096) {
            EXPECT_EQ(chunks[i].bytes % 4096, 0u);
          }
          next += chunks[i].bytes;
        }
        EXPECT_EQ(next, per_rank);
        ++checked;
      }
  EXPECT_GT(checked, 200);
}

TEST(StagedChunks, OneChunkWhenItFits) {
  auto chunks = zc::staged_chunks(100 << 20, 4, 512ull << 20);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].bytes, 100u << 20);
  EXPECT_TRUE(zc::staged_chunks(0, 4, 1 << 20).empty());
}

TEST(StagedChunks, EagerAndCapturedAreasAreDisjointSlotRanges) {
  for (uint64_t pool : {16ull << 20, 1ull << 30, 4ull << 30}) {
    zc::ArenaLayout l = zc::ArenaLayout::make(pool, 128ull << 20);
    zc::StagingArea eager = zc::staging_area(l, false), graph = zc::staging_area(l, true);
    EXPECT_EQ(eager.offset, l.slot_offset(0));
    EXPECT_EQ(eager.offset + eager.bytes, graph.offset);
    EXPECT_EQ(graph.offset + graph.bytes, l.arena_bytes());
    EXPECT_GT(eager.bytes, 0u);
    EXPECT_GT(graph.bytes, 0u);
    EXPECT_GE(eager.offset, l.marker_offset() + 4);  // never over a flag or the marker
  }
}

}  // namespace
