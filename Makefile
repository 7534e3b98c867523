# Front door to the CMake build (CMakeLists.txt is the real one).
#   make            build libzerocta.so, the tools and the tests into ./build
#   make test       run the CPU test suite (GPU tests skip without a GPU): ctest's summary, the
#                   whole log in build/ctest.log (and on the screen when a test fails)
#   make deps       install missing build tools (apt), check CUDA and NCCL headers
#   make demo       side-by-side all-gather on the local GPUs, NCCL vs zerocta (builds only
#                   the library and the demo)
#   make install PREFIX=/opt/zerocta   the stripped library, its header, the launcher, the demo
#                   and the tools (nothing to link: LD_PRELOAD it, or zerocta-run)
#   make sanitize   CPU tests under ASan+UBSan (./build-asan)
#   make tsan       CPU tests under ThreadSanitizer (./build-tsan)
#   make fuzz       libFuzzer targets for their bounded time (clang, ./build-fuzz)
#   make format     clang-format every source file
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all configure deps test demo install sanitize tsan fuzz format clean

all: configure
	cmake --build $(BUILD) -j $(JOBS)

configure:
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo

# About a minute of tests on 2 cores once built (the build from clean: about 8 minutes).
test: all
	@echo "make test: $$(ctest --test-dir $(BUILD) -N | tail -n1 | sed 's/Total //'), about a minute on 2 cores; log: $(BUILD)/ctest.log"
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) >$(BUILD)/ctest.log 2>&1 || \
	  { cat $(BUILD)/ctest.log; exit 1; }
	@sed -n '/tests passed/,$$p' $(BUILD)/ctest.log

deps:
	tools/zerocta-deps

# ZEROCTA_ALLGATHER=zerocta: the demo shows the copy-engine route at every size, where it wins
# and where it does not (the library's default, nccl, would leave plain buffers to NCCL).
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target zerocta zerocta-demo
	./$(BUILD)/tools/zerocta-demo
	LD_PRELOAD=$(CURDIR)/$(BUILD)/libzerocta.so ZEROCTA_ALLGATHER=zerocta ZEROCTA_STATS=1 \
	  ./$(BUILD)/tools/zerocta-demo

install: all
	cmake --install $(BUILD) --prefix $(PREFIX) --strip

sanitize:
	cmake -S . -B build-asan $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DZEROCTA_SANITIZE=address,undefined -DZEROCTA_BUILD_TOOLS=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure -LE nosan -j $(JOBS)

tsan:
	cmake -S . -B build-tsan $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DZEROCTA_SANITIZE=thread -DZEROCTA_BUILD_TOOLS=OFF
	cmake --build build-tsan -j $(JOBS)
	TSAN_OPTIONS=second_deadlock_stack=1 ctest --test-dir build-tsan --output-on-failure -LE nosan -j $(JOBS)

# Only the fuzz targets are built with clang; the rest of the tree is tested with gcc above.
fuzz:
	CC=clang CXX=clang++ cmake -S . -B build-fuzz $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROCTA_BUILD_TOOLS=OFF
	cmake --build build-fuzz -j $(JOBS) --target zerocta_config_fuzz
	ctest --test-dir build-fuzz --output-on-failure -L fuzz

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
