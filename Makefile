# shardpoint: `make demo` runs the main job, `make test` runs every test.
# Both install missing Debian packages first (`make deps`: scripts/install-deps.sh); `make
# build` does not install anything.

BUILD        ?= build
BUILD_SAN    ?= build-san
JOBS         ?= $(shell nproc)
FUZZ_SECONDS ?= 30
CMAKE_FLAGS  ?=
# Parsers and the engine under ASan/UBSan (the LibTorch and most multi-process suites are
# not rebuilt there: they add build time, not parser coverage).
ASAN_TESTS   ?= core_test pickle_test torchfile_test format_test engine_test engine_io_test async_save_test commit_order_test storage_test
# ccache hits across clones (CI builds a fresh clone in another folder).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps build demo test test-cpp test-python wheel test-asan fuzz bench oracle clean

all: build

deps:
	@scripts/install-deps.sh all

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

# Everything: libraries, libshardpoint.so, commands, tests, benchmarks. Installs nothing.
build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The main job: an end-to-end demonstration (see scripts/demo.sh). Builds only the two
# commands it runs and libshardpoint.so (its Python part).
# The Python venv of its last step (scripts/setup-python.sh: downloads, mostly) is made
# while they compile; its log goes to $(BUILD)/setup-python.log.
demo:
	@scripts/install-deps.sh demo
	$(MAKE) --no-print-directory $(BUILD)/build.ninja
	@scripts/setup-python.sh >$(BUILD)/setup-python.log 2>&1 & venv=$$!; \
	  cmake --build $(BUILD) -j $(JOBS) --target shardpoint shardpoint-train shardpoint_c; built=$$?; \
	  wait $$venv; exit $$built
	scripts/demo.sh $(BUILD)

# Every test: the C++ suites (ctest, interop with the oracles included), then the Python
# package's (pytest, on the newest PyTorch and on the PyTorch 2.6 oracle).
test: deps oracle
	@# A build configured by `make demo`, before `make deps` installed Open MPI: search again.
	@if grep -qs '^SHARDPOINT_MPI_FOUND:INTERNAL=\(FALSE\|0\|OFF\|\)$$' $(BUILD)/CMakeCache.txt && command -v mpicxx >/dev/null; then \
	  cmake -S . -B $(BUILD) -U 'MPI*' >/dev/null; fi
	$(MAKE) --no-print-directory build
	$(MAKE) --no-print-directory test-cpp
	$(MAKE) --no-print-directory test-python

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Builds the wheel, installs it into build-wheel/site, runs python/tests (scripts/test-python.sh).
test-python:
	BUILD=$(BUILD) scripts/test-python.sh

# The Python package as a wheel in dist/ (one wheel for every CPython 3 on Linux x86-64).
wheel: deps
	PY=$$(scripts/setup-python.sh) && "$$PY" -m pip wheel . --no-deps --no-build-isolation -w dist

# The PyTorch 2.6 oracle root (cached under /var/cache/shardpoint/oracle-trixie, or
# $$SHARDPOINT_ORACLE_ROOT; see scripts/setup-oracle.sh). Warns and skips without root/network,
# fails when SHARDPOINT_REQUIRE_ORACLES=1.
oracle: deps
	@if [ -x scripts/setup-oracle.sh ]; then scripts/setup-oracle.sh; fi

# One clang build serves the sanitizer tests and the fuzzers, so the library compiles once:
# AddressSanitizer + UndefinedBehaviorSanitizer (a UB report aborts) and libFuzzer's coverage
# instrumentation on every object, -O1 with assertions on. Without Gloo and LibTorch (GCC
# only): the multi-process tests built there run over the TCP communicator.
$(BUILD_SAN)/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_SAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DSHARDPOINT_SANITIZE=ON -DSHARDPOINT_FUZZ=ON \
	  -DSHARDPOINT_BENCH=OFF $(CMAKE_FLAGS)

# The unit and corruption tests again under ASan/UBSan, JOBS suites at a time.
test-asan: deps $(BUILD_SAN)/build.ninja
	cmake --build $(BUILD_SAN) -j $(JOBS) --target $(ASAN_TESTS)
	scripts/run-sanitized-tests.sh $(BUILD_SAN) $(JOBS) $(ASAN_TESTS)

# libFuzzer targets, each run for FUZZ_SECONDS.
fuzz: deps $(BUILD_SAN)/build.ninja
	cmake --build $(BUILD_SAN) -j $(JOBS) --target fuzzers
	scripts/run-fuzzers.sh $(BUILD_SAN) $(FUZZ_SECONDS)

bench: deps
	$(MAKE) --no-print-directory build
	scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_SAN) build-wheel dist
