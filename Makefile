# forge: the two commands of the README's Quick start, and their parts.
#   make train   install deps, build, train the demo GPT (configs/tiny.toml), sample from it
#   make test    install deps, build, run every test; then the sanitizer build (make sanitize-test)
#   make install put forge on the PATH (PREFIX, default /usr/local)
BUILD      ?= build
BUILD_TYPE ?= Release
FORGE_CUDA ?= AUTO
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps deps-runtime configure build install test sanitize-test train bench clean

all: build

# deps: what the tests need too (make test); deps-runtime: building and training only (make train,
# make install), without GoogleTest, Google Benchmark, PyTorch and the Fashion-MNIST data.
deps:
	bash scripts/install-deps.sh

deps-runtime:
	bash scripts/install-deps.sh --runtime

# TESTS=OFF configures without the tests and benchmarks (what make train and make install build).
TESTS ?= ON
configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFORGE_CUDA=$(FORGE_CUDA) \
	  -DFORGE_BUILD_TESTS=$(TESTS) -DFORGE_BUILD_BENCHMARKS=$(TESTS) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# forge on the PATH: $(PREFIX)/bin/forge, the configs in $(PREFIX)/share/forge/configs (so the
# docs' `forge train configs/tiny.toml` works from any directory). Builds first when $(BUILD)/forge
# is missing; `make train` then `sudo make install` for /usr/local, or PREFIX=$$HOME/.local without sudo.
PREFIX ?= /usr/local
install:
	@[ -x $(BUILD)/forge ] || $(MAKE) deps-runtime build TESTS=OFF
	cmake --install $(BUILD) --prefix $(PREFIX)

test: deps
	$(MAKE) build TESTS=ON
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) sanitize-test

# The code that reads untrusted files and sockets, under AddressSanitizer + UndefinedBehaviorSanitizer
# (SECURITY.md): the CPU library at -O1, the parser/data/io/tokenizer/config/rendezvous tests and the
# fuzz corpora (tests/fuzz/corpus: seeds and every crash ever found), in $(SAN_BUILD).
SAN_BUILD  ?= build-asan
SANITIZERS ?= address,undefined
sanitize-test: deps
	cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1" \
	  -DFORGE_CUDA=OFF -DFORGE_SANITIZE=$(SANITIZERS) -DFORGE_BUILD_BENCHMARKS=OFF $(CMAKE_ARGS)
	cmake --build $(SAN_BUILD) -j $(JOBS) --target forge_sanitize_tests forge_fuzz_replay
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -L sanitize

# The demo: a small GPT on the fortunes corpus (configs/tiny.toml writes runs/tiny), then a
# sample from its final checkpoint.
# (forge sets OMP_WAIT_POLICY=passive itself when the environment does not: Note [CPU threading
# defaults] in apps/forge/threading_defaults.h; `forge info` shows it.)
# `make train` again continues the run or says it is finished (docs/train.md, "Long runs");
# `make train TRAIN_ARGS=--run.overwrite=true` starts it afresh.
TRAIN_CONFIG  ?= configs/tiny.toml
TRAIN_ARGS    ?=
TRAIN_RUN     ?= runs/tiny
SAMPLE_PROMPT ?= The meaning of life is

train: deps-runtime
	$(MAKE) build TESTS=OFF
	./$(BUILD)/forge train $(TRAIN_CONFIG) $(TRAIN_ARGS)
	./$(BUILD)/forge sample --checkpoint $(TRAIN_RUN) --prompt "$(SAMPLE_PROMPT)" --tokens 120 --temperature 0.8 --top-k 40 --seed 1

bench: deps configure
	cmake --build $(BUILD) -j $(JOBS) --target forge_cpu_bench
	./$(BUILD)/benchmarks/cpu/forge_cpu_bench

clean:
	rm -rf $(BUILD) $(SAN_BUILD)
