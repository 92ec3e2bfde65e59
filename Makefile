# llmgw developer entry points.
#
#   make deps    install missing Debian packages (scripts/deps.sh)
#   make build   build build/nginx/ngx_http_llmgw_module.so (scripts/build.sh)
#   make unit    build src/*.cpp + t/unit/test_*.c (CMocka) and run them
#   make run     deps + build, then PostgreSQL + migrations + nginx under var/
#   make stop    stop nginx, the plugin runtime and PostgreSQL (`make run`)
#   make test    deps + build + unit + SQL tests + integration tests
#   make clean   remove build/
#   make v8host  build build/v8host/llmgw-v8host (V8 from .deps/libnode,
#                fetched first when missing: v8_host/fetch-libnode.sh)
#   make v8host-test  build the helper and run t/v8host/ against it
#
# Variables: PORT (8080), PGPORT_LLMGW (5433), PGPORT_LLMGW_TEST (5434),
#   LLMGW_RESOLVER (make run's DNS server; /etc/resolv.conf's first),
#   UNIT="test_a test_b" (run only these unit tests), UNIT_VERBOSE=1,
#   UNIT_TIMEOUT (seconds per unit test binary, 120), JOBS (nproc).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
# Keep intermediate objects (pattern-rule products) between runs.
.SECONDARY:

REPO := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
ifneq ($(abspath $(CURDIR)),$(REPO))
$(error run make from the repository root ($(REPO)), e.g. make -C $(REPO) ...)
endif

JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: help deps build unit unit-build run stop test clean v8host v8host-test

help:
	@sed -n '3,13s/^# \{0,1\}//p' Makefile

deps:
	@scripts/deps.sh

build:
	@scripts/build.sh

run:
	@scripts/deps.sh
	@scripts/build.sh
	@scripts/run.sh

stop:
	@scripts/stop.sh

# scripts/test.sh builds and runs `make unit` itself so that one failing
# part does not hide the others; it prints the one-line summary.
test:
	@scripts/deps.sh
	@scripts/test.sh

clean:
	rm -rf build

# ---------------------------------------------------------------------------
# Unit tests: src/*.cpp -> build/unit/libllmgw_core.a;
# each t/unit/test_*.c -> build/unit/test_* linked with it.  Other
# t/unit/*.c files are shared helpers linked into every test.
# Tests run from the repository root with LLMGW_REPO set.

UNIT_DIR      := build/unit
UNIT_CXX      ?= g++
UNIT_CC       ?= gcc
UNIT_CXXFLAGS ?= -std=c++17 -O1 -g -Wall -Wextra -fPIC
UNIT_CFLAGS   ?= -std=gnu11 -O1 -g -Wall -Wextra
UNIT_CPPFLAGS := -Isrc -It/unit
UNIT_LIBS     ?= -lcmocka -ljansson -lcrypto -lstdc++ -lm -pthread
UNIT_TIMEOUT  ?= 120

CORE_SRCS  := $(sort $(wildcard src/*.cpp))
CORE_OBJS  := $(patsubst src/%.cpp,$(UNIT_DIR)/obj/%.o,$(CORE_SRCS))
CORE_LIB   := $(UNIT_DIR)/libllmgw_core.a
TEST_SRCS  := $(sort $(wildcard t/unit/test_*.c))
HELP_SRCS  := $(filter-out $(TEST_SRCS),$(sort $(wildcard t/unit/*.c)))
HELP_OBJS  := $(patsubst t/unit/%.c,$(UNIT_DIR)/obj/t_%.o,$(HELP_SRCS))
TEST_NAMES := $(patsubst t/unit/%.c,%,$(TEST_SRCS))
ifneq ($(strip $(UNIT)),)
TEST_NAMES := $(filter $(UNIT),$(TEST_NAMES))
endif
TEST_BINS  := $(addprefix $(UNIT_DIR)/,$(TEST_NAMES))

unit-build: $(CORE_LIB) $(TEST_BINS)

$(UNIT_DIR)/obj/%.o: src/%.cpp | $(UNIT_DIR)/obj
	$(UNIT_CXX) $(UNIT_CXXFLAGS) $(UNIT_CPPFLAGS) -MMD -MP -c -o $@ $<

$(UNIT_DIR)/obj/t_%.o: t/unit/%.c | $(UNIT_DIR)/obj
	$(UNIT_CC) $(UNIT_CFLAGS) $(UNIT_CPPFLAGS) -MMD -MP -c -o $@ $<

# Rebuilt from scratch so members of deleted sources disappear.
$(CORE_LIB): $(CORE_OBJS) | $(UNIT_DIR)/obj
	rm -f $@
	ar rcs $@ $(CORE_OBJS)

$(UNIT_DIR)/test_%: t/unit/test_%.c $(CORE_LIB) $(HELP_OBJS) | $(UNIT_DIR)/obj
	$(UNIT_CC) $(UNIT_CFLAGS) $(UNIT_CPPFLAGS) -MMD -MP -MF $(UNIT_DIR)/obj/test_$*.d \
	    -o $@ $< $(HELP_OBJS) $(CORE_LIB) $(UNIT_LIBS)

$(UNIT_DIR)/obj:
	mkdir -p $@

-include $(wildcard $(UNIT_DIR)/obj/*.d)

# Build what builds (-k), run every test binary that is up to date, count a
# test that did not build as failed.  Summary: "unit: N passed, M failed"
# (N, M count test programs; each program's CMocka case count is shown).
unit:
	@build_ok=1; \
	$(MAKE) --no-print-directory -k -j$(JOBS) unit-build || build_ok=; \
	pass=0; fail=0; failed=; \
	if [ -z "$(TEST_NAMES)" ]; then echo "unit: no t/unit/test_*.c$(if $(UNIT), matching '$(UNIT)')"; fi; \
	for t in $(TEST_NAMES); do \
	    bin=$(UNIT_DIR)/$$t; log=$(UNIT_DIR)/$$t.log; \
	    if [ -z "$$build_ok" ] && ! $(MAKE) --no-print-directory -q $$bin >/dev/null 2>&1; then \
	        printf '  FAIL  %s (did not build)\n' "$$t"; fail=$$((fail+1)); failed="$$failed $$t"; continue; \
	    fi; \
	    rc=0; LLMGW_REPO=$(REPO) timeout -k 5 $(UNIT_TIMEOUT) ./$$bin >$$log 2>&1 || rc=$$?; \
	    n=$$(sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' $$log | awk '{s+=$$1} END {print s+0}'); \
	    nf=$$(sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' $$log | awk '{s+=$$1} END {print s+0}'); \
	    if [ $$rc -eq 0 ]; then \
	        printf '  ok    %s (%s cases)\n' "$$t" "$$n"; pass=$$((pass+1)); \
	        if [ -n "$(UNIT_VERBOSE)" ]; then sed 's/^/        /' $$log; fi; \
	    else \
	        if [ $$rc -eq 124 ] || [ $$rc -eq 137 ]; then why="timed out after $(UNIT_TIMEOUT) s"; \
	        elif [ $$rc -gt 128 ]; then why="killed by signal $$((rc-128))"; \
	        else why="exit $$rc, $$nf failed case(s)"; fi; \
	        printf '  FAIL  %s (%s); log: %s\n' "$$t" "$$why" "$$log"; \
	        tail -n 80 $$log | sed 's/^/        /'; \
	        fail=$$((fail+1)); failed="$$failed $$t"; \
	    fi; \
	done; \
	if [ -z "$$build_ok" ] && [ $$fail -eq 0 ]; then echo "unit: build of src/ or a helper failed"; fail=$$((fail+1)); fi; \
	echo "unit: $$pass passed, $$fail failed"; \
	[ $$fail -eq 0 ]

# ---------------------------------------------------------------------------
# v8_host: the plugin runtime helper, build/v8host/llmgw-v8host.
# V8 10.2 comes from Debian's libnode108 unpacked into .deps/libnode
# (v8_host/fetch-libnode.sh; `make deps` runs it too).  Compiled with
# -isystem against those headers only, never /usr/include/node (Node 20's
# V8 11.3), and without V8_COMPRESS_POINTERS (the library is built without).
# The core's objects (frame codec, manifest rules, helpers) are linked in
# as objects.

LIBNODE          := .deps/libnode
LIBNODE_STAMP    := $(LIBNODE)/.complete
LIBNODE_ARCH      = $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
LIBNODE_LIB       = $(LIBNODE)/usr/lib/$(LIBNODE_ARCH)
V8HOST_DIR       := build/v8host
V8HOST_BIN       := $(V8HOST_DIR)/llmgw-v8host
V8HOST_CXX       ?= g++
V8HOST_CXXFLAGS  ?= -std=c++17 -O2 -g -Wall -Wextra -pthread
V8HOST_CPPFLAGS  := -Isrc -Iv8_host -isystem $(LIBNODE)/usr/include/node
V8HOST_LIBS       = -L$(LIBNODE_LIB) -lnode \
                    -Wl,-rpath,'$$ORIGIN/../../$(LIBNODE_LIB)' \
                    -Wl,-rpath,$(REPO)/$(LIBNODE_LIB) \
                    -ljansson -lcrypto -pthread
V8HOST_SRCS      := $(sort $(wildcard v8_host/*.cpp))
V8HOST_OBJS      := $(patsubst v8_host/%.cpp,$(V8HOST_DIR)/obj/%.o,$(V8HOST_SRCS))
V8HOST_CORE_OBJS := $(patsubst src/%.cpp,$(V8HOST_DIR)/obj/core_%.o,$(CORE_SRCS))
V8HOST_TEST_TIMEOUT ?= 120

v8host: $(V8HOST_BIN)

$(LIBNODE_STAMP):
	@v8_host/fetch-libnode.sh

$(V8HOST_BIN): $(V8HOST_OBJS) $(V8HOST_CORE_OBJS)
	$(V8HOST_CXX) $(V8HOST_CXXFLAGS) -o $@ $(V8HOST_OBJS) $(V8HOST_CORE_OBJS) $(V8HOST_LIBS)

# -fno-rtti: libnode is built without RTTI, so a subclass of a V8 class
# (the ArrayBuffer allocator) cannot reference V8's typeinfo.
$(V8HOST_DIR)/obj/%.o: v8_host/%.cpp | $(LIBNODE_STAMP) $(V8HOST_DIR)/obj
	$(V8HOST_CXX) $(V8HOST_CXXFLAGS) -fno-rtti $(V8HOST_CPPFLAGS) -MMD -MP -c -o $@ $<

$(V8HOST_DIR)/obj/core_%.o: src/%.cpp | $(V8HOST_DIR)/obj
	$(V8HOST_CXX) $(V8HOST_CXXFLAGS) -Isrc -MMD -MP -c -o $@ $<

$(V8HOST_DIR)/obj:
	mkdir -p $@

-include $(wildcard $(V8HOST_DIR)/obj/*.d)

# t/v8host/*.test.mjs (node --test) against the built helper.
v8host-test: $(V8HOST_BIN)
	@LLMGW_REPO=$(REPO) LLMGW_V8HOST=$(REPO)/$(V8HOST_BIN) \
	    timeout -k 5 $(V8HOST_TEST_TIMEOUT) node --test --test-reporter=spec t/v8host/
