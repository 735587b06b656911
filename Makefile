# Convenience front end over CMake. `make demo` installs what is missing (Debian/Ubuntu),
# builds, and runs the built-in demo model; `make test` builds and runs the whole test suite;
# `make python` installs the Python package into .venv.
BUILD ?= build
BUILD_TYPE ?= Release
WERROR ?= OFF
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
DEB_PACKAGES = build-essential cmake ninja-build pkg-config libfmt-dev nlohmann-json3-dev \
  libcli11-dev libpcre2-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev \
  libedit-dev libgtest-dev libgmock-dev libbenchmark-dev clang-format \
  python3-venv python3-numpy python3-pytest python3-wheel \
  libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools

.PHONY: all deps configure build test test-deps demo python clean

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

# The npm packages of the node tests (each pinned by its lockfile): the OpenAI client test and
# the browser test (puppeteer-core); installed when missing or older than the lockfile. The
# browser test also needs Debian's chromium, installed here when apt can (root or sudo); without
# npm or chromium those tests skip themselves.
NODE_TESTS = tests/openai_client tests/webui
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
	  echo "installing chromium for the browser test"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; } || \
	    echo "could not install chromium: the browser test will skip"; \
	fi

# The Python package (python/, import deltafin) in a virtual environment over Debian's python3
# (numpy from python3-numpy), with this build's libdeltafin.so bundled in. See docs/PYTHON.md.
VENV ?= .venv
python: deps build
	bash python/install.sh $(VENV) $(BUILD)/src/capi/libdeltafin.so

demo: deps build
	$(BUILD)/src/cli/deltafin run --prompt "The king said" --max-new 40 --temperature 0.7 --seed 3 --stats

clean:
	rm -rf $(BUILD)
