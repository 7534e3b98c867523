/* Keeps libzerocta.so loadable on glibc 2.34 (RHEL 9; Ubuntu 22.04 has 2.35) when it is built
 * on a newer one. The library links the C++ runtime statically (-static-libstdc++
 * -static-libgcc: it must not depend on the application's libstdc++), and two parts of that
 * runtime, built against the toolchain's glibc, import symbols newer than 2.34:
 *
 *   arc4random        GLIBC_2.36  libstdc++.a(random.o), std::random_device, pulled in by the
 *                                 locale/iostream objects that std::ifstream needs;
 *   _dl_find_object   GLIBC_2.35  libgcc_eh.a(unwind-dw2-fde-dip.o), the exception unwinder's
 *                                 lookup of an address's unwind tables.
 *
 * Defined here, inside the library (hidden, and local by src/exports.map), the link resolves
 * those references to these definitions instead of to libc, so the library imports nothing
 * newer than GLIBC_2.34 (tests/interpose/test_first_contact.cc checks `objdump -T`). Each is
 * compiled only when the toolchain's glibc has the symbol, i.e. when its runtime may use it.
 * Linked into libzerocta.so only (not into the unit tests, which use the system's runtime). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define ZC_HIDDEN __attribute__((visibility("hidden")))

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 36)
/* glibc's arc4random: 32 random bits from the kernel's generator, never failing (it aborts
 * when no randomness can be had). std::random_device("default") is its only user here. */
ZC_HIDDEN uint32_t arc4random(void) {
  uint32_t value = 0;
  for (;;) {
    const ssize_t n = getrandom(&value, sizeof(value), 0); /* GLIBC_2.25 */
    if (n == (ssize_t)sizeof(value)) return value;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != ENOSYS) break;
    /* A kernel without getrandom (before 3.17): the device, as glibc did before 2.36. */
    const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      const ssize_t got = read(fd, &value, sizeof(value));
      close(fd);
      if (got == (ssize_t)sizeof(value)) return value;
    }
    break;
  }
  abort();
}
#endif

#ifdef DLFO_STRUCT_HAS_EH_DBASE /* <dlfcn.h> of glibc 2.35 or later declares _dl_find_object */
#if DLFO_STRUCT_HAS_EH_DBASE
#error "glibc_compat.c: _dl_find_object with dlfo_eh_dbase (32-bit targets) is not provided"
#endif

struct zc_find {
  uintptr_t pc;
  struct dl_find_object* out;
  int found;
};

/* The loaded object whose PT_LOAD segments hold f->pc: its mapping and its PT_GNU_EH_FRAME
 * (what libgcc's unwinder looked up with dl_iterate_phdr before glibc 2.35). */
static int find_object(struct dl_phdr_info* info, size_t size, void* data) {
  struct zc_find* f = (struct zc_find*)data;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  void* eh_frame = NULL;
  int inside = 0;
  (void)size;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD) {
      const uintptr_t end = start + ph->p_memsz;
      if (start < lo) lo = start;
      if (end > hi) hi = end;
      if (f->pc >= start && f->pc < end) inside = 1;
    } else if (ph->p_type == DLFO_EH_SEGMENT_TYPE) {
      eh_frame = (void*)start;
    }
  }
  if (!inside) return 0;
  memset(f->out, 0, sizeof(*f->out));
  f->out->dlfo_map_start = (void*)lo;
  f->out->dlfo_map_end = (void*)hi;
  f->out->dlfo_eh_frame = eh_frame;
  f->found = 1;
  return 1;
}

/* glibc's _dl_find_object: 0 and *result filled when address is inside a loaded object,
 * -1 otherwise. */
ZC_HIDDEN int _dl_find_object(void* address, struct dl_find_object* result) {
  struct zc_find f = {(uintptr_t)address, result, 0};
  dl_iterate_phdr(&find_object, &f);
  if (!f.found) return -1;
  Dl_info info;
  struct link_map* map = NULL;
  if (dladdr1(address, &info, (void**)&map, RTLD_DL_LINKMAP) != 0) result->dlfo_link_map = map;
  return 0;
}
#endif
