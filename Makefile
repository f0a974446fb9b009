# pgjobq - a job queue that lives in PostgreSQL.  Plain GNU make; no other build tool.
#
#   make demo             build, start the embedded PostgreSQL, run `pgjobq demo` (DEMO_ARGS=...)
#   make                  library (static + shared), the pgjobq command, pgjobq.pc
#   make check            the test suite against a throwaway PostgreSQL the tests start themselves
#   make sanitize         the test suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#   make install PREFIX=/usr/local
#   make format           clang-format every C file (the pinned .clang-format)
#
# What is missing is installed with apt-get when running as root; otherwise the build stops and
# prints the command to run (tools/ensure-deps.sh): make and make install need libpq's and
# libmicrohttpd's headers; make demo, bench and soak also the PostgreSQL server binaries; make check,
# sanitize, chaos and screenshots also the test tools (Chromium, promtool, g++, Node.js, Python's
# psycopg/SQLAlchemy/pytest, PgBouncer, pg_auto_failover).

PREFIX  ?= /usr/local
DESTDIR ?=
B       ?= build
CC      ?= cc
SAN     ?=

VERSION := 0.1.0
SOVER   := 0

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
           -Wno-format-nonliteral
CSTD    := -std=c11 -D_GNU_SOURCE
OPT     ?= -O2 -g
ifneq ($(SAN),)
OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
endif

# Found when used (not when the Makefile is read), so that a missing libpq can be installed first.
PG_CFLAGS = $(shell pkg-config --cflags libpq 2>/dev/null || echo -I`pg_config --includedir`)
PG_LIBS   = $(shell pkg-config --libs libpq 2>/dev/null || echo -L`pg_config --libdir` -lpq)
# The pgjobq command's HTTP server (serve, work --metrics-listen); the library does not use it.
MHD_LIBS  = $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)

CFLAGS_ALL = $(CSTD) $(WARN) $(OPT) -Iinclude $(PG_CFLAGS) $(CFLAGS)
LDFLAGS_ALL = $(OPT) $(LDFLAGS)

LIB_SRC  := $(wildcard src/*.c)
LIB_OBJ  := $(patsubst src/%.c,$(B)/src/%.o,$(LIB_SRC)) $(B)/src/migrations.o
CLI_SRC  := $(wildcard cli/*.c)
CLI_OBJ  := $(patsubst cli/%.c,$(B)/cli/%.o,$(CLI_SRC))
TEST_SRC := $(wildcard tests/*.c)
TEST_OBJ := $(patsubst tests/%.c,$(B)/tests/%.o,$(TEST_SRC))
SQL      := $(sort $(wildcard sql/[0-9][0-9][0-9]_*.sql))
SQL_FUNCTIONS := $(sort $(wildcard sql/functions/*.sql))
# The router database's (`pgjobq migrate --router`): its migrations, its grants, its function files.
ROUTER_SQL := $(sort $(wildcard sql/router/[0-9][0-9][0-9]_*.sql)) sql/router/roles.sql \
              $(sort $(wildcard sql/router/functions/*.sql))

LIBA  := $(B)/libpgjobq.a
LIBSO := $(B)/libpgjobq.so.$(VERSION)
CLI   := $(B)/pgjobq
TESTS := $(B)/tests/runner
PC    := $(B)/pgjobq.pc
DEPS_OK := $(B)/.deps-ok

.PHONY: FORCE all check sanitize install uninstall clean format deps demo examples bench soak chaos fuzz screenshots abi
all: $(LIBA) $(LIBSO) $(CLI) $(PC)

$(DEPS_OK): tools/ensure-deps.sh
	@mkdir -p $(B)
	@sh tools/ensure-deps.sh
	@touch $@

deps:
	@sh tools/ensure-deps.sh --tests

# The numbered migrations, the role grants and the function files, as C strings (src/migrate.c).  The
# directory is a prerequisite too, so that a function file removed or renamed rebuilds it.
$(B)/src/migrations.c: $(SQL) sql/roles.sql $(SQL_FUNCTIONS) $(wildcard sql/functions) $(ROUTER_SQL) \
                       $(wildcard sql/router/functions) tools/embed-sql.awk | $(DEPS_OK)
	@mkdir -p $(@D)
	awk -f tools/embed-sql.awk $(SQL) sql/roles.sql $(SQL_FUNCTIONS) $(ROUTER_SQL) > $@.tmp && mv $@.tmp $@

$(B)/src/%.o: src/%.c src/internal.h src/engine.h include/pgjobq.h | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -fPIC -fvisibility=hidden -DPGJOBQ_BUILDING -c $< -o $@

$(B)/src/migrations.o: $(B)/src/migrations.c
	$(CC) $(CSTD) $(OPT) -fPIC -fvisibility=hidden -c $< -o $@

$(LIBA): $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(LIBSO): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libpgjobq.so.$(SOVER) $(LDFLAGS_ALL) -o $@ $^ $(PG_LIBS)
	ln -sf libpgjobq.so.$(VERSION) $(B)/libpgjobq.so.$(SOVER)
	ln -sf libpgjobq.so.$(SOVER) $(B)/libpgjobq.so

$(B)/cli/%.o: cli/%.c $(wildcard cli/*.h) include/pgjobq.h | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(CLI): $(CLI_OBJ) $(LIBA)
	$(CC) $(LDFLAGS_ALL) -o $@ $(CLI_OBJ) $(LIBA) $(PG_LIBS) $(MHD_LIBS) -lpthread -lm

$(B)/tests/%.o: tests/%.c tests/harness.h include/pgjobq.h src/internal.h src/engine.h cli/pgserver.h | $(DEPS_OK)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -Isrc -Icli -c $< -o $@

# The harness shares cli/pgserver.c (finding and running the server programs) with the command.
$(TESTS): $(TEST_OBJ) $(B)/cli/pgserver.o $(LIBA)
	$(CC) $(LDFLAGS_ALL) -o $@ $(TEST_OBJ) $(B)/cli/pgserver.o $(LIBA) $(PG_LIBS) -lpthread -lm

# examples/ use the public header only (no -Isrc), like any program built against pgjobq.
EXAMPLES := $(B)/examples/producer $(B)/examples/worker
examples: $(EXAMPLES)
$(B)/examples/%: examples/%.c include/pgjobq.h $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(CSTD) $(WARN) $(OPT) -Iinclude $(PG_CFLAGS) $(CFLAGS) -o $@ $< $(LIBA) $(PG_LIBS) -lpthread

# The README's main command: no database to set up, the embedded one is created on first use.
demo: all
	@sh tools/ensure-deps.sh --server
	$(CLI) demo $(DEMO_ARGS)

# Written again whenever PREFIX (or the version) differs from the file's, so that
# `make install PREFIX=/some/where` after a plain `make` installs a pgjobq.pc that points there.
$(PC): pgjobq.pc.in Makefile FORCE
	@mkdir -p $(@D)
	@sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' pgjobq.pc.in > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

FORCE:

# The tests start their own PostgreSQL; TESTS_ARGS selects tests by name (substring), e.g.
#   make check TESTS_ARGS='claim lease'
check: all $(TESTS) $(EXAMPLES) abi
	@sh tools/ensure-deps.sh --tests
	@[ -d examples/node/node_modules/pg ] || (cd examples/node && npm ci --no-audit --no-fund --loglevel=error)
	PGJOBQ_CLI=$(abspath $(CLI)) PGJOBQ_EXAMPLES=$(abspath $(B)/examples) PGJOBQ_SRCDIR=$(CURDIR) \
	    PGJOBQ_TEST_CFLAGS="$(OPT)" $(TESTS) $(TESTS_ARGS)

# Under the sanitizers the short chaos forms run 20 s (one turn of their eight faults) instead of 30,
# and the Python package's suite is left out (its C side, the coprocess worker, is test_coproc's, which
# runs): CI runs both suites and must stay under 25 minutes.
sanitize:
	PGJOBQ_CHAOS_SECONDS=$${PGJOBQ_CHAOS_SECONDS:-20} $(MAKE) B=build-san SAN=1 check \
	    TESTS_ARGS="-x python_package_pytest $(TESTS_ARGS)"

# The ABI: the exported symbols are exactly those of pgjobq.sym (adding one is a deliberate change of
# that file; removing one, or changing a public struct incompatibly, also bumps SOVER), and the header
# compiles and works as C++.
abi: $(LIBSO) $(LIBA)
	@sh tools/ensure-deps.sh --tests
	@nm -D --defined-only $(LIBSO) | awk '$$2 == "T" { print $$3 }' | sort > $(B)/symbols.txt
	@diff -u pgjobq.sym $(B)/symbols.txt || { echo "abi: the library exports a different set of symbols than pgjobq.sym" >&2; exit 1; }
	@command -v $(CXX) >/dev/null 2>&1 || { echo "abi: a C++ compiler ($(CXX)) is needed to check the header" >&2; exit 1; }
	@mkdir -p $(B)/tests
	$(CXX) -std=c++11 -Wall -Wextra -Werror -pedantic $(OPT) -Iinclude $(PG_CFLAGS) -o $(B)/tests/cxx_header tests/cxx/header.cpp \
	    $(LIBA) $(PG_LIBS) -lpthread
	@$(B)/tests/cxx_header > /dev/null

# libFuzzer on every parser of untrusted input, FUZZ_SECONDS each (corpus in tests/fuzz/corpus).
FUZZ_SECONDS ?= 30
FUZZ_CC ?= clang
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -Icli $(PG_CFLAGS)
fuzz: | $(DEPS_OK)
	@command -v $(FUZZ_CC) >/dev/null 2>&1 || { echo "make fuzz needs clang (apt-get install clang)" >&2; exit 69; }
	@mkdir -p $(B)/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $(B)/fuzz/json tests/fuzz/fuzz_json.c src/json.c
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $(B)/fuzz/sanitize tests/fuzz/fuzz_sanitize.c src/json.c
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $(B)/fuzz/duration tests/fuzz/fuzz_duration.c cli/util.c -lm
	for t in json sanitize duration; do \
	    mkdir -p $(B)/fuzz/corpus-$$t && cp tests/fuzz/corpus/$$t/* $(B)/fuzz/corpus-$$t/ && \
	    $(B)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(B)/fuzz/corpus-$$t || exit 1; \
	done

# The fault suite, long form: two modes of CHAOS_SECONDS of faults each, under 10 minutes in all
# on 2 cores (the short form, 30 s each, is part of make check).
CHAOS_SECONDS ?= 240
chaos: all $(TESTS)
	@sh tools/ensure-deps.sh --tests
	PGJOBQ_CLI=$(abspath $(CLI)) PGJOBQ_SRCDIR=$(CURDIR) PGJOBQ_CHAOS_SECONDS=$(CHAOS_SECONDS) $(TESTS) -v chaos failover max_connections worker_on_a_standby

# The seed's deployment for a long time (SOAK_SECONDS, default 600; see bench/soak.sh).
soak: all
	@sh tools/ensure-deps.sh --server
	PGJOBQ=$(abspath $(CLI)) sh bench/soak.sh

# Benchmarks on their own throwaway cluster with durable settings; QUICK=1 for a short run.
# Plots need gnuplot (installed with apt-get when running as root; skipped otherwise).
bench: all
	@sh tools/ensure-deps.sh --server
	@command -v gnuplot >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	    (apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null 2>&1)) || true
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/run.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/shards.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/durable.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/aging.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/strict.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/notify.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/floor.sh
	PGJOBQ=$(abspath $(CLI)) QUICK=$(QUICK) sh bench/cost.sh
	PGJOBQ=$(abspath $(CLI)) sh bench/steps.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man3
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/pgjobq
	install -m 644 include/pgjobq.h $(DESTDIR)$(PREFIX)/include/pgjobq.h
	install -m 644 $(LIBA) $(DESTDIR)$(PREFIX)/lib/libpgjobq.a
	install -m 755 $(LIBSO) $(DESTDIR)$(PREFIX)/lib/libpgjobq.so.$(VERSION)
	ln -sf libpgjobq.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libpgjobq.so.$(SOVER)
	ln -sf libpgjobq.so.$(SOVER) $(DESTDIR)$(PREFIX)/lib/libpgjobq.so
	install -m 644 $(PC) $(DESTDIR)$(PREFIX)/lib/pkgconfig/pgjobq.pc
	install -m 644 docs/pgjobq.1 $(DESTDIR)$(PREFIX)/share/man/man1/pgjobq.1
	install -m 644 docs/pgjobq.3 $(DESTDIR)$(PREFIX)/share/man/man3/pgjobq.3

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/pgjobq $(DESTDIR)$(PREFIX)/include/pgjobq.h \
	    $(DESTDIR)$(PREFIX)/lib/libpgjobq.a $(DESTDIR)$(PREFIX)/lib/libpgjobq.so* \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig/pgjobq.pc $(DESTDIR)$(PREFIX)/share/man/man1/pgjobq.1 \
	    $(DESTDIR)$(PREFIX)/share/man/man3/pgjobq.3

format:
	clang-format -i include/*.h src/*.c src/*.h cli/*.c tests/*.c tests/*.h

clean:
	rm -rf build build-*

# The README's pictures of `pgjobq serve` (docs/img/*.png), from a throwaway embedded database.
screenshots: all
	@sh tools/ensure-deps.sh --tests
	PGJOBQ=$(abspath $(CLI)) sh tools/screenshots.sh
