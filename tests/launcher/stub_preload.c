/* A stand-in for libzerocta.so in the launcher tests: a valid, harmless shared object, so a
 * test can check that the launcher's LD_PRELOAD really loads it into grandchildren (it shows up
 * in /proc/self/maps) without depending on the real library or on sanitizer runtimes. */
int zerocta_launcher_test_stub(void) { return 42; }
