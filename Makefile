# Convenience front end over CMake. `make demo` installs what is missing (Debian/Ubuntu),
# builds, and runs the built-in demo model; `make test` builds and runs the whole test suite.
BUILD ?= build
BUILD_TYPE ?= Release
WERROR ?= OFF
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
DEB_PACKAGES = build-essential cmake ninja-build pkg-config libfmt-dev nlohmann-json3-dev \
  libcli11-dev libpcre2-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev \
  libedit-dev libgtest-dev libgmock-dev libbenchmark-dev

.PHONY: all deps configure build test test-deps demo clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDELTAFIN_WERROR=$(WERROR)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The npm package of the OpenAI client test (tests/openai_client, pinned by its lockfile):
# installed when missing or older than the lockfile; without npm the test skips itself.
OPENAI_CLIENT = tests/openai_client
test-deps:
	@if command -v npm >/dev/null 2>&1 && \
	  { [ ! -f $(OPENAI_CLIENT)/node_modules/.package-lock.json ] || \
	    [ $(OPENAI_CLIENT)/package-lock.json -nt $(OPENAI_CLIENT)/node_modules/.package-lock.json ]; }; then \
	  echo "installing the openai npm package for the client test"; \
	  cd $(OPENAI_CLIENT) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

demo: deps build
	$(BUILD)/src/cli/deltafin run --prompt "The king said" --max-new 40 --temperature 0.7 --seed 3 --stats

clean:
	rm -rf $(BUILD)
