# forge: the two commands of the README's Quick start, and their parts.
#   make train   install deps, build, run the demo (today: the worked autograd example)
#   make test    install deps, build, run every test
BUILD      ?= build
BUILD_TYPE ?= Release
FORGE_CUDA ?= AUTO
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test train bench clean

all: build

deps:
	bash scripts/install-deps.sh

configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFORGE_CUDA=$(FORGE_CUDA) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

train: deps
	$(MAKE) build
	./$(BUILD)/forge autograd-demo

bench: deps configure
	cmake --build $(BUILD) -j $(JOBS) --target forge_cpu_bench
	./$(BUILD)/benchmarks/cpu/forge_cpu_bench

clean:
	rm -rf $(BUILD)
