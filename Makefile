# Convenience front end over CMake. `make demo` installs what is missing (Debian/Ubuntu),
# builds, and runs the built-in demo model; `make test` builds and runs the whole test suite;
# `make python` installs the Python package into .venv. `make test-asan` / `make test-tsan` run
# the suite (all of it / the threaded parts) under sanitizers, `make fuzz` the libFuzzer targets
# (fuzz/), each in its own build folder; CI (.ci/run) runs all three after `make test`.
BUILD ?= build
BUILD_TYPE ?= Release
WERROR ?= OFF
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# What building the program, the library and the Debian package needs (`make deps-build`: the
# container image's build stage installs only these; `file` is what CPack's dpkg-shlibdeps step
# uses) ...
BUILD_PACKAGES = build-essential cmake ninja-build pkg-config file libfmt-dev nlohmann-json3-dev \
  libcli11-dev libpcre2-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev libxxhash-dev \
  libcurl4-openssl-dev libedit-dev libsleef-dev libvulkan-dev glslc libpng-dev libjpeg62-turbo-dev \
  libwebp-dev libgif-dev
# ... and everything the tests, the sanitizer builds and the GPU tests need on top (`make deps`).
DEB_PACKAGES = $(BUILD_PACKAGES) libgtest-dev libgmock-dev libbenchmark-dev clang-format \
  python3-venv python3-numpy python3-pytest python3-wheel clang libclang-rt-14-dev \
  mesa-vulkan-drivers vulkan-tools

.PHONY: all deps deps-build configure build test test-deps test-perf demo python deb \
  test-package clean configure-asan test-asan configure-tsan test-tsan fuzz test-hardening

all: build

# Installs the packages of $(1) that are missing (apt-get; sudo when not root).
define install_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(2) \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEB_PACKAGES),command -v node >/dev/null 2>&1 || missing="$$missing nodejs npm";)

deps-build:
	$(call install_missing,$(BUILD_PACKAGES),)

configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDELTAFIN_WERROR=$(WERROR)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Timed tests (ctest label perf) are left out of `make test`: a shared or loaded machine makes
# their timings noise. `make test-perf` runs them alone (one at a time, nothing else running,
# please): today the forecast check of `deltafin doctor` (tests/doctor_perf.py), which makes two
# 7.8 GB models in $(BUILD)/perf-models on first use and takes 10-30 minutes.
test: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE perf

test-perf: build
	cd $(BUILD) && ctest --output-on-failure -L perf

# Sanitizer builds: clang, -O1 with line tables (the usual sanitizer setting: quick to build,
# readable reports). build-asan is
# AddressSanitizer + UndefinedBehaviorSanitizer with libFuzzer's coverage instrumentation, so the
# same build runs the whole suite (test-asan) and links the fuzz programs (fuzz). Excluded under
# ASan, with the reason: PythonPackage (CPython cannot dlopen an ASan-built libdeltafin.so unless
# the ASan runtime is preloaded into the interpreter) and CApiInstall (it compiles a program
# from the installed pkg-config flags, which do not carry -fsanitize, so it cannot link).
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# Both are unity builds (CMAKE_UNITY_BUILD: most of their compile time is code generated for the
# shared headers, once per file otherwise; tests/CMakeLists.txt groups the test files).
SAN_CMAKE = CC=clang CXX=clang++ cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=Sanitize \
  "-DCMAKE_CXX_FLAGS_SANITIZE=-O1 -gline-tables-only" -DDELTAFIN_BUILD_BENCH=OFF \
  -DCMAKE_UNITY_BUILD=ON -DDELTAFIN_WERROR=$(WERROR)
# The agents too, ServerClients.ClaudeCode* and .Codex* (with and without an image): each
# prefills an agent's 30,000-50,000-token prompt, minutes under ASan; the same server paths run
# under ASan through the SDK tests (ServerClients.AnthropicSdk, .OpenAiResponses, .OllamaLibrary,
# .ImagesFromEveryClientToTheDemo) and ServerApi.*. And *.EveryClientCallsToolsAndContinuesFrom
# TheKeptState (K2, Kimi-Linear): the four npm clients through three servers each on a make-model
# of the release's widths, 1-5 minutes in the Release build on 2 cores, past the test timeout
# under ASan; the same family server paths run under ASan in K2Release.ServeAnswersAnOpenAIChat
# WithAToolCall, the reuse paths in the Reuse* and KimiLinearPreset snapshot tests.
ASAN_EXCLUDE = ^(PythonPackage|CApiInstall|ServerClients[.](ClaudeCode|Codex).*|.*[.]EveryClientCallsToolsAndContinuesFromTheKeptState)$$
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
# The threaded parts under ThreadSanitizer: the server (in-process units and the real binary,
# itself built with TSan: a race in it makes it exit 66 and fails the test), the scheduler, the
# thread and reader pools, the expert store and shard files, the homes on several drives (per-drive
# reader queues, hedged and fallback reads, `place` and its interruption), the prefix snapshot
# store and the server's state reuse (its faults and sampling), and the fault-injection tests; and,
# by name, the tests that reach the other threaded paths: the trunk streamer and the expert
# store's prefetch under a memory budget (Budget: streaming, greedy generation), and the
# scheduler drafting for several sequences at once (serve --parallel with drafters and with a
# draft model folder), the C API freeing a handle another thread is using, and the server's log
# line of a request cancelled in prefill (written on the engine's thread). Budget.PeakRss is
# left out: it measures RSS, which TSan's shadow inflates.
TSAN_TESTS = ^((Server|ServerAuth|ServerRequest|ServerResponse|ServerFaults|Server/ReadFaults|ThreadPool|ReaderPool|Store|ShardFiles|Homes|Place|Drives|PrefixTree|PrefixFiles|PrefixReuse|ReuseFaults|ReuseSampling|MaskOverlap)[./]|Budget[.](StreamingIsExact|GreedyGeneration)|StreamOverlap[.](ReadAheadWaits|DeeperTrunkReadAhead)|SpeculativeCli[.]ServeParallel|DraftSurfaces[.]ChatAndServe|CApi[.]FreeingAHandleInUseByAnotherThreadStopsTheCall|HardenedLog[.]RequestStoppedInPrefill)
# tools/tsan-suppressions.txt: one entry, an uninstrumented Debian library; its reason is written there.
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tools/tsan-suppressions.txt

configure-asan:
	$(SAN_CMAKE) -B $(ASAN_BUILD) -DDELTAFIN_SANITIZE=ON -DDELTAFIN_FUZZ=ON

test-asan: configure-asan test-deps
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -E '$(ASAN_EXCLUDE)' -LE perf

configure-tsan:
	$(SAN_CMAKE) -B $(TSAN_BUILD) -DDELTAFIN_TSAN=ON

test-tsan: configure-tsan test-deps
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target deltafin_tests deltafin
	cd $(TSAN_BUILD) && ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

# Each fuzz target for FUZZ_SECONDS (CI: a few seconds each, to catch a regression), its corpus
# kept in $(ASAN_BUILD)/fuzz-corpus and seeded from tests/data/fuzz; see tools/fuzz.sh.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= safetensors config tokenizer_files tokenizer chat request http gbnf json_schema \
  schema_merge hub_listing image media
fuzz: configure-asan
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target deltafin_fuzzers
	bash tools/fuzz.sh $(ASAN_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The three hardening stages in CI's order, then the stamp that lets CI skip them while the files
# they cover stay as they were (tests/hardening/covered.sh; the rule: docs/PERFORMANCE.md, "CI
# stages"). Whoever changes code runs this before stopping and commits tests/hardening/verified.
test-hardening: test-asan fuzz test-tsan
	bash tests/hardening/covered.sh > tests/hardening/verified

# The npm packages of the node tests (each pinned by its lockfile): the OpenAI client test, the
# browser test (puppeteer-core), the Anthropic / OpenAI Responses / Ollama SDK tests
# (tests/api_clients) and the agents (tests/agent_clients: Claude Code and Codex, ~760 MB with
# their native programs) and ajv, the independent JSON Schema validator of the structured-output
# test (tests/structured_output, ~1 MB). The rule that keeps CI time small: each folder is installed with
# `npm ci` only when node_modules is missing or older than its lockfile, so a machine installs
# the agents once (about 20 s from the registry here) and later runs of `make test` reuse them;
# a fresh CI machine installs them once per run (docs/PERFORMANCE.md, "CI"). The browser test also
# needs Debian's chromium, installed here when apt can (root or sudo); without npm or chromium
# those tests skip themselves.
NODE_TESTS = tests/openai_client tests/webui tests/api_clients tests/agent_clients tests/structured_output
test-deps:
	@for d in $(NODE_TESTS); do \
	  if command -v npm >/dev/null 2>&1 && \
	    { [ ! -f $$d/node_modules/.package-lock.json ] || \
	      [ $$d/package-lock.json -nt $$d/node_modules/.package-lock.json ]; }; then \
	    echo "installing the npm packages of $$d"; \
	    (cd $$d && npm ci --no-audit --no-fund --loglevel=error) || exit 1; \
	  fi; \
	done
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO="sudo -n"; \
	  echo "installing Debian's chromium for the browser test (apt-get install chromium; apt may also upgrade packages it depends on)"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; } || \
	    echo "could not install chromium: the browser test will skip"; \
	fi

# The Python package (python/, import deltafin) in a virtual environment over Debian's python3
# (numpy from python3-numpy), with this build's libdeltafin.so bundled in. See docs/PYTHON.md.
VENV ?= .venv
# Only the library it bundles is built (not the command line or the test suite).
python: deps configure
	cmake --build $(BUILD) -j $(JOBS) --target deltafin_shared
	bash python/install.sh $(VENV) $(BUILD)/src/capi/libdeltafin.so

# The Debian package (CPack, cmake/package.cmake): its own build folder, configured for /usr
# with the package's extra install rules (Python package, docs, systemd unit) and without the
# tests; the package is $(DEB_BUILD)/deltafin_VERSION_ARCH.deb.
DEB_BUILD ?= build-deb
deb:
	cmake -S . -B $(DEB_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
	  -DDELTAFIN_PACKAGE=ON -DDELTAFIN_BUILD_TESTS=OFF -DDELTAFIN_BUILD_BENCH=OFF \
	  -DDELTAFIN_WERROR=$(WERROR)
	cmake --build $(DEB_BUILD) -j $(JOBS) --target deltafin deltafin_shared
	cd $(DEB_BUILD) && cpack -G DEB
	@ls $(DEB_BUILD)/deltafin_*.deb

# The container image and the Debian package with podman (tests/package/package_test.sh: a local
# debian:12 base image, the image built from the package `make deb` makes, the demo, serve and
# compose.yaml inside, the systemd unit). Slow (5-10 minutes), so `.ci/run` runs it
# only when the files it covers changed since it last passed (tests/package/covered.sh: the
# stamp in tests/package/verified, which a passing run here rewrites: commit it).
# DELTAFIN_PACKAGE_FROM_SOURCE=1 builds the image from source as `podman build .` does.
test-package: build
	bash tests/package/package_test.sh . $(BUILD) $(BUILD)/package-test
	bash tests/package/covered.sh > tests/package/verified

# The demo needs only the program: it is built first (minutes, not the whole tree's tests,
# fuzzers and benchmarks), so the demo prints before anything else is compiled.
demo: deps configure
	cmake --build $(BUILD) -j $(JOBS) --target deltafin
	$(BUILD)/src/cli/deltafin run --prompt "The king said" --max-new 40 --temperature 0.7 --seed 3 --stats

clean:
	rm -rf $(BUILD)
