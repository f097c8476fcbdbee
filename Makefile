# autoreply - build, test, sanitizers, fuzzing, benchmarks.
#   make            library + bin/autoreply
#   make test       every test (unit, golden fixtures, fuzz corpus replay)
#   make asan       the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       libFuzzer targets (clang), run briefly over their corpus
#   make bench      benchmark programs under bench/
#   make deps       install the Debian packages the build needs (root)
#   make install    libautoreply.a, libautoreply.so, autoreply.h and autoreply.pc under
#                   $(DESTDIR)$(PREFIX) (PREFIX=/usr/local); make uninstall removes them

CC       ?= cc
BUILD    ?= build
OPT      ?= -O2
WERROR   ?=
SAN      ?=
PKGS     := libmicrohttpd sqlite3 libpcre2-8 libcjson msgpack libpq hiredis librabbitmq zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wcast-qual -Wpointer-arith -Wformat=2 -Wvla -Wundef -Wdouble-promotion
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) -g -fno-math-errno -pthread $(WARN) \
              $(if $(WERROR),-Werror) $(SAN) -Iinclude -Isrc $(PKG_CFLAGS) $(CFLAGS)
LDLIBS_ALL := $(PKG_LIBS) -lm -pthread $(LDLIBS)

# Per-file ISA flags: only kernels/ builds SIMD code; the choice is made at run time.
FLAGS_avx2        := -mavx2 -mfma -mf16c
FLAGS_avx512      := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
FLAGS_avx512_vnni := $(FLAGS_avx512) -mavx512vnni
FLAGS_avx512_bf16 := $(FLAGS_avx512_vnni) -mavx512bf16

# Modules in layer order (ARCHITECTURE.md) and what each may use: DEPS_<module> is what the
# files of src/<module>/ may include (tools/check-includes.sh, docs/architecture.md "Who may use
# whom") and what tests/<module>/ link.
MODULES := base gguf kernels kv tokenizer sampler model metrics store cache queue engine reply server api
# tests/cli/ drive bin/autoreply as a user would, tests/deploy/ the deploy/ scripts and nginx,
# tests/fleet/ a whole fleet on the real servers; they link only base (TEST_DEPS_cli: src/cli/,
# the program, uses every module).
TEST_ONLY_MODULES := cli deploy fleet
DEPS_base      :=
DEPS_gguf      := base
DEPS_kernels   := base
DEPS_kv        := base
DEPS_tokenizer := gguf base
DEPS_sampler   := base
DEPS_model     := gguf kernels kv base
DEPS_metrics   := base
DEPS_store     := base
DEPS_cache     := base
DEPS_queue     := base
DEPS_engine    := model tokenizer sampler gguf kernels kv base
DEPS_reply     := engine store cache queue metrics model tokenizer sampler gguf kernels kv base
DEPS_server    := reply engine store cache queue metrics model tokenizer sampler gguf kernels kv base
DEPS_api       := reply engine store cache queue metrics model tokenizer sampler gguf kernels kv base
DEPS_cli       := server reply engine store cache queue metrics model tokenizer sampler gguf kernels kv base
TEST_DEPS_cli  := base
DEPS_deploy    := base
DEPS_fleet     := base

srcs_of = $(wildcard src/$(1)/*.c)
objs_of = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(call srcs_of,$(1))) $(GEN_OBJS_$(1))

# The console's files (web/console/) compiled into the server as byte arrays, so that
# `autoreply serve` needs no files on disk (tools/embed-console.sh writes the C file).
CONSOLE_FILES := $(sort $(wildcard web/console/*))
GEN_OBJS_server := $(BUILD)/obj/gen/console_assets.o
lib_of  = $(BUILD)/lib/libar_$(1).a
libs_for = $(foreach m,$(1) $(if $(TEST_DEPS_$(1)),$(TEST_DEPS_$(1)),$(DEPS_$(1))),$(call lib_of,$(m)))

LIB_ALL := $(BUILD)/libautoreply.a
# Sanitizer and fuzz builds keep their binary in their own folder, never over bin/autoreply.
BIN     := $(if $(filter build,$(BUILD)),bin/autoreply,$(BUILD)/bin/autoreply)

.PHONY: all test asan tsan fuzz fuzz-run bench deps clean format check-fixtures install uninstall \
        print-deps check-includes check-names
all: $(BIN)

# Library objects are position-independent with hidden visibility: the same objects make
# libautoreply.a and libautoreply.so, and the .so exports only what include/autoreply.h marks
# AR_API (hidden symbols still link statically, and calls between them stay direct).
LIB_CFLAGS := -fPIC -fvisibility=hidden

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LIB_CFLAGS) $(FLAGS_$(basename $(notdir $<))) -MMD -MP -c $< -o $@

$(BUILD)/gen/console_assets.c: $(CONSOLE_FILES) tools/embed-console.sh
	@mkdir -p $(dir $@)
	sh tools/embed-console.sh $@ $(CONSOLE_FILES)

$(BUILD)/obj/gen/console_assets.o: $(BUILD)/gen/console_assets.c src/server/console_assets.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LIB_CFLAGS) -c $< -o $@

define module_lib
$(call lib_of,$(1)): $(call objs_of,$(1))
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach m,$(MODULES) $(TEST_ONLY_MODULES),$(eval $(call module_lib,$(m))))

$(LIB_ALL): $(foreach m,$(MODULES),$(call objs_of,$(m)))
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# The shared library: soname libautoreply.so.$(SO_MAJOR), the version from autoreply.h.
VERSION  := $(shell sed -n 's/^\#define AR_VERSION "\(.*\)"/\1/p' include/autoreply.h)
SO_MAJOR := $(firstword $(subst ., ,$(VERSION)))
SO_NAME  := libautoreply.so.$(SO_MAJOR)
SO_REAL  := libautoreply.so.$(VERSION)
LIB_SO   := $(BUILD)/$(SO_REAL)
# every symbol resolved at link time (not for sanitizer builds: their runtime comes with the
# program)
SO_LDFLAGS := -shared -Wl,-soname,$(SO_NAME) $(if $(SAN),,-Wl,--no-undefined)
$(LIB_SO): $(foreach m,$(MODULES),$(call objs_of,$(m)))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -o $@ $^ $(LDLIBS_ALL)
	ln -sf $(SO_REAL) $(BUILD)/$(SO_NAME)
	ln -sf $(SO_NAME) $(BUILD)/libautoreply.so

$(BIN): $(call objs_of,cli) $(LIB_ALL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $(call objs_of,cli) $(LIB_ALL) $(LDLIBS_ALL)

# ---- tests: tests/<module>/<name>_test.c links its module's closure ---------------------
TEST_SRCS := $(wildcard tests/*/*_test.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
test_mod = $(word 2,$(subst /, ,$(1)))

define test_rule
$(patsubst tests/%.c,$(BUILD)/tests/%,$(1)): $(1) $(call libs_for,$(call test_mod,$(1))) $(wildcard tests/harness/*.h)
	@mkdir -p $$(dir $$@)
	$(CC) $(CFLAGS_ALL) -Wno-missing-prototypes -Itests -o $$@ $(1) \
	    $(call libs_for,$(call test_mod,$(1))) -lcmocka $(LDLIBS_ALL)
endef
$(foreach t,$(TEST_SRCS),$(eval $(call test_rule,$(t))))

# Fuzz targets double as corpus-replay programs in every build.
FUZZ_SRCS := $(wildcard fuzz/*_fuzz.c)
FUZZ_REPLAY := $(patsubst fuzz/%.c,$(BUILD)/fuzz/%_replay,$(FUZZ_SRCS))
$(BUILD)/fuzz/%_replay: fuzz/%.c fuzz/replay_main.c $(LIB_ALL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Wno-missing-prototypes -o $@ $< fuzz/replay_main.c $(LIB_ALL) $(LDLIBS_ALL)

# the shared library too: tests/cli/install_test installs it
tests: $(TEST_BINS) $(FUZZ_REPLAY) $(BIN) $(LIB_SO)

test: tests
	@BUILD=$(BUILD) AR_BIN=./$(BIN) sh tests/run.sh

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" test

# ThreadSanitizer over the tests that exercise threads: pool, engine, server, metrics, store,
# in-process reply cache, the public API (two threads, callbacks, cancellation).
TSAN_TESTS := base/base_test engine/engine_test server/server_test server/sessions_test \
              api/api_test \
              server/workflow_test \
              metrics/metrics_test \
              store/store_test reply/fleet_test cache/cache_test
tsan:
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" \
	    $(addprefix build-tsan/tests/,$(TSAN_TESTS))
	@rc=0; p=0; f=0; k=0; names=""; for t in $(TSAN_TESTS); do echo "== tsan $$t"; \
	    log=build-tsan/$$(basename $$t).log; \
	    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/tests/$$t \
	        >$$log 2>&1 || { cat $$log; rc=1; f=$$((f + 1)); \
	        names="$$names tsan:$$t$$(sed -En 's/^\[  (FAILED  |ERROR   )\] ([^ ]+)$$/:\2/p' $$log | sort -u | tr -d '\n')"; }; \
	    n=$$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' $$log); p=$$((p + $${n:-0})); \
	    n=$$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' $$log); k=$$((k + $${n:-0})); \
	    tail -n 1 $$log; done; \
	echo "$$p $$f $$k" >build-tsan/test-summary; echo "$$names" >build-tsan/test-failures; \
	echo "tsan: $$p passed, $$f failed, $$k skipped"; exit $$rc

# ---- fuzzing (clang + libFuzzer) --------------------------------------------------------
FUZZ_CFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz OPT=-O1 SAN="$(FUZZ_CFLAGS)" build-fuzz/libautoreply.a
	@mkdir -p build-fuzz/bin
	@for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); \
	    echo "clang $$f"; \
	    clang -std=c11 -D_GNU_SOURCE -O1 -g -Iinclude -Isrc $(PKG_CFLAGS) \
	        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	        -o build-fuzz/bin/$$n $$f build-fuzz/libautoreply.a $(LDLIBS_ALL) || exit 1; done

FUZZ_SECONDS ?= 30
fuzz-run: fuzz
	@for f in $(FUZZ_SRCS); do n=$$(basename $$f .c); \
	    mkdir -p build-fuzz/corpus/$$n; \
	    d=""; [ -f fuzz/$$n.dict ] && d="-dict=fuzz/$$n.dict"; \
	    echo "fuzzing $$n for $(FUZZ_SECONDS)s"; \
	    build-fuzz/bin/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 $$d \
	        build-fuzz/corpus/$$n fuzz/corpus/$$n || exit 1; done

# ---- benchmarks ---------------------------------------------------------------------------
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
$(BUILD)/bench/%: bench/%.c $(LIB_ALL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Wno-missing-prototypes -o $@ $< $(LIB_ALL) $(LDLIBS_ALL)
bench: $(BENCH_BINS) $(BIN)

check-fixtures: $(BIN)
	$(BIN) check-fixtures ../shared/fixtures
	$(BIN) check-fixtures ../shared/fixtures-arch

# One line per folder of src/: "module: what it may use", or "module?" when it has no DEPS line.
SRC_DIRS := $(sort $(patsubst src/%/,%,$(wildcard src/*/)))
print-deps:
	@$(foreach m,$(SRC_DIRS),echo '$(m)$(if $(filter undefined,$(origin DEPS_$(m))),?,: $(DEPS_$(m)))';)

# The include graph against DEPS_<module> and docs/architecture.md (tests/base/includes_test.c
# runs it too).
check-includes:
	@sh tools/check-includes.sh

# Every symbol of a module's archive starts with the module's prefix (docs/architecture.md).
check-names: $(foreach m,$(MODULES) cli,$(call lib_of,$(m)))
	@sh tools/check-names.sh $(BUILD)/lib

deps:
	sh tools/install-deps.sh

# ---- install ------------------------------------------------------------------------------
# autoreply.pc: linking the static library needs the Debian libraries behind PKGS, libm and
# pthreads (Libs.private, which `pkg-config --static` adds; as plain -l flags rather than
# Requires.private, so that their own private libraries are not asked for); the shared one
# carries its dependencies itself.
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PCDIR      ?= $(LIBDIR)/pkgconfig
install: $(LIB_ALL) $(LIB_SO)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PCDIR)
	install -m 644 $(LIB_ALL) $(DESTDIR)$(LIBDIR)/libautoreply.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(SO_REAL)
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_NAME)
	ln -sf $(SO_NAME) $(DESTDIR)$(LIBDIR)/libautoreply.so
	install -m 644 include/autoreply.h $(DESTDIR)$(INCLUDEDIR)/autoreply.h
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	    'Name: autoreply' \
	    'Description: LLM inference engine and review-reply service for GGUF models' \
	    'Version: $(VERSION)' \
	    'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lautoreply' \
	    'Libs.private: $(strip $(PKG_LIBS)) -lm -pthread' >$(DESTDIR)$(PCDIR)/autoreply.pc
	chmod 644 $(DESTDIR)$(PCDIR)/autoreply.pc

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libautoreply.a $(DESTDIR)$(LIBDIR)/$(SO_REAL) \
	    $(DESTDIR)$(LIBDIR)/$(SO_NAME) $(DESTDIR)$(LIBDIR)/libautoreply.so \
	    $(DESTDIR)$(INCLUDEDIR)/autoreply.h $(DESTDIR)$(PCDIR)/autoreply.pc

format:
	clang-format -i $$(find src tests fuzz bench include -name '*.[ch]')

clean:
	rm -rf build build-asan build-tsan build-fuzz bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
