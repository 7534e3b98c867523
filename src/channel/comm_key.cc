#include "comm_key.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace zc {
namespace {

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);
    v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);
  }
};

// The key of every hash this user's processes derive from unique ids: not a secret between
// them (each can compute it), only a way to keep raw id bytes and other users' names apart
// (two users' jobs with one NCCL_COMM_ID do not meet at one name).
SipKey user_key() {
  const uint64_t uid = static_cast<uint64_t>(geteuid());
  return {0x7a65726f63746121ull ^ (uid * 0x9e3779b97f4a7c15ull), 0x6368616e6e656c31ull ^ uid};
}

// 128 bits of SipHash-2-4 under `key`: two 64-bit hashes under two related keys.
CommKey hash128(const void* data, size_t n, const SipKey& key) {
  return CommKey{siphash24(data, n, key.k0, key.k1),
                 siphash24(data, n, key.k1 ^ 0xa5a5a5a5a5a5a5a5ull, key.k0)};
}

// The secret of the ids' job: a hash of the same bytes as their public one under a distinct
// key, so that neither tells the other.
SipKey secret_of(const void* ids, size_t n) {
  SipKey k = user_key();
  k.k0 ^= 0x7365637265742121ull;  // "secret!!"
  const CommKey h = hash128(ids, n, k);
  return SipKey{h.lo, h.hi};
}

std::mutex g_counts_mu;
using CountKey = std::pair<std::pair<uint64_t, uint64_t>, int>;  // (ids hash, rank)
std::map<CountKey, uint64_t>& id_counts() {
  static auto* m = new std::map<CountKey, uint64_t>;  // outlives exit
  return *m;
}

// A child key: the parent's public key, a tag, the ordinal, then the tag's own values, hashed
// under the parent's secret, which the child inherits.
CommKey child_key(const CommKey& parent, uint64_t tag, uint64_t ordinal,
                  const std::vector<int64_t>& values) {
  std::vector<uint64_t> words = {parent.lo, parent.hi, tag, ordinal, values.size()};
  for (int64_t v : values) words.push_back(static_cast<uint64_t>(v));
  CommKey child = hash128(words.data(), words.size() * sizeof(uint64_t), parent.secret);
  child.secret = parent.secret;
  return child;
}

// A forked child starts its own count: the parent's peers know nothing of the child, and the
// child's own peers (a world it builds) count from zero too.
void lock_counts() { g_counts_mu.lock(); }
void unlock_counts() { g_counts_mu.unlock(); }
void reset_in_child() {
  g_counts_mu.unlock();
  id_counts().clear();
}
[[maybe_unused]] const int g_atfork = pthread_atfork(lock_counts, unlock_counts, reset_in_child);

}  // namespace

std::string CommKey::hex() const {
  char text[33];
  snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(hi),
           static_cast<unsigned long long>(lo));
  return text;
}

uint64_t siphash24(const void* data, size_t n, uint64_t k0, uint64_t k1) {
  SipState s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
             k1 ^ 0x7465646279746573ull};
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const size_t whole = n - n % 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m;
    memcpy(&m, p + i, 8);  // little-endian hosts only (x86-64, aarch64)
    s.v3 ^= m;
    s.round(), s.round();
    s.v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(n & 0xff) << 56;
  for (size_t i = 0; i < n % 8; ++i) last |= static_cast<uint64_t>(p[whole + i]) << (8 * i);
  s.v3 ^= last;
  s.round(), s.round();
  s.v0 ^= last;
  s.v2 ^= 0xff;
  s.round(), s.round(), s.round(), s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

CommKey key_for_init(const ncclUniqueId* ids, int nids, int rank) {
  const size_t bytes = sizeof(ncclUniqueId) * static_cast<size_t>(nids);
  CommKey ids_hash = hash128(ids, bytes, user_key());
  ids_hash.secret = secret_of(ids, bytes);
  uint64_t ordinal;
  {
    std::lock_guard<std::mutex> lock(g_counts_mu);
    ordinal = id_counts()[{{ids_hash.lo, ids_hash.hi}, rank}]++;
  }
  return child_key(ids_hash, /*tag=*/1, ordinal, {});
}

CommKey key_for_split(const CommKey& parent, uint64_t ordinal, int color) {
  return child_key(parent, /*tag=*/2, ordinal, {color});
}

CommKey key_for_shrink(const CommKey& parent, uint64_t ordinal, std::vector<int> excluded) {
  std::sort(excluded.begin(), excluded.end());
  return child_key(parent, /*tag=*/3, ordinal,
                   std::vector<int64_t>(excluded.begin(), excluded.end()));
}

void reset_key_counts() {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  id_counts().clear();
}

}  // namespace zc
