/*
 * zerocta public API.
 *
 * libzerocta.so is meant to be LD_PRELOADed; an application never has to link it. Every
 * function here can be found at run time with dlsym(RTLD_DEFAULT, "zerocta_..."): when the
 * symbol is absent the shim is not loaded.
 */
#ifndef ZEROCTA_H_
#define ZEROCTA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZEROCTA_VERSION_MAJOR 0
#define ZEROCTA_VERSION_MINOR 1
#define ZEROCTA_VERSION_PATCH 0

/* Collectives counted by the shim. */
typedef enum {
  zerocta_op_allgather = 0,
  zerocta_op_allreduce,
  zerocta_op_reducescatter,
  zerocta_op_broadcast,
  zerocta_op_reduce,
  zerocta_op_alltoall,
  zerocta_op_gather,
  zerocta_op_scatter,
  zerocta_op_send,
  zerocta_op_recv,
  zerocta_op_count
} zerocta_op_t;

/* How an intercepted collective was executed. */
typedef enum {
  zerocta_route_passthrough = 0, /* forwarded to NCCL unchanged */
  zerocta_route_ce,              /* zerocta's own copy-engine route */
  zerocta_route_nccl_ce,         /* forwarded to NCCL on symmetric windows (NCCL's CE path) */
  zerocta_route_count
} zerocta_route_t;

typedef struct {
  uint64_t calls;
  uint64_t bytes; /* bytes received by this rank (all-gather: the whole output) */
} zerocta_counter_t;

typedef struct {
  zerocta_counter_t counters[zerocta_op_count][zerocta_route_count];
  uint64_t comms_created;     /* communicators created through the shim */
  uint64_t comms_zero_policy; /* of those, created with NCCL_CTA_POLICY_ZERO */
  uint64_t comms_ce_ready;    /* of those, with an agreed copy-engine pool */
  uint64_t pool_bytes;        /* memory zerocta's route holds in this process now: its pinned
                                 host flags, its reduce-scatter scratch and its mappings of
                                 peers' buffers and scratch */
  uint64_t inner_calls;       /* NCCL's calls into its own API, passed straight through */
} zerocta_stats_t;

/* Version of the loaded shim, encoded as MAJOR*10000 + MINOR*100 + PATCH. */
int zerocta_version(void);

/* Copies a consistent snapshot of this process's counters. Returns 0 on success. */
int zerocta_get_stats(zerocta_stats_t* out);

/* Resets this process's counters to zero. */
void zerocta_reset_stats(void);

/* Writes the counters as JSON to path (mode 0600, never following a symlink).
 * Returns 0 on success, an errno value otherwise. */
int zerocta_write_stats_json(const char* path);

/* Short names: "allgather", "passthrough", "ce", ... NULL for an out-of-range value. */
const char* zerocta_op_name(zerocta_op_t op);
const char* zerocta_route_name(zerocta_route_t route);

/* Checks this process's environment as it is now with the library's own parser, the one its
 * first NCCL call uses, and needs neither NCCL nor a GPU: writes to fd, in the log's line
 * format and whatever ZEROCTA_LOG says, a WARN per invalid ZEROCTA_* value and per unknown
 * ZEROCTA_* name, then the effective configuration (INFO). Returns the number of invalid
 * values: 0 = the library runs with exactly what is set (unknown names only warn). A program
 * without the shim preloaded can dlopen libzerocta.so to call it (tools/zerocta-run --check). */
int zerocta_check_config(int fd);

#ifdef __cplusplus
}
#endif
#endif /* ZEROCTA_H_ */
