#!/usr/bin/env bash
# The container image and the Debian package, tested with podman as they are used:
#   1. a debian:12 base image made locally (no registry is reachable here): debootstrap
#      --variant=minbase bookworm, then `podman import`; kept for later runs;
#   2. the package (`make deb` on this Debian 12 host, in its own build folder; with
#      DELTAFIN_PACKAGE_FROM_SOURCE=1 the image's build stage compiles from source instead, as
#      `podman build .` does for a user) and the image: `podman build --isolation=chroot
#      --pull=never`; its runtime stage installs the .deb into a fresh Debian 12 with apt;
#   3. inside: the package's files (binary, library, header, pkg-config file, Python package,
#      docs, systemd unit), the unprivileged user, `import deltafin`, the built-in demo;
#   4. `serve` (the image's default) with a model mounted read-only, /health through the image's
#      health check, a chat completion from the host; the same through compose.yaml with
#      podman-compose when it is installable;
#   5. the systemd unit checked by `systemd-analyze verify` against the package's files.
# Running needs `podman --runtime runc` with explicit ulimits (crun refuses: "cgroups in hybrid
# mode not supported"). podman, runc, debootstrap and podman-compose are installed here when
# missing (apt-get, as root): they are what this test needs, not build dependencies.
# Exit 77 (skipped) when they cannot be had (not root, no apt).
#   usage: package_test.sh SOURCE_DIR BUILD_DIR WORK_DIR (BUILD_DIR: a build with the deltafin
#   binary, used on the host to unpack the demo model that is mounted into the container)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$3
image=localhost/deltafin:test
name=deltafin-test-$$
mkdir -p "$work"
work=$(cd "$work" && pwd)
log() { echo "== package test: $*"; }

missing=""
for p in podman runc debootstrap podman-compose; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "skipping: needs$missing (root and apt-get to install them)"
    exit 77
  fi
  log "installing$missing"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then echo "skipping: podman runs rootful here (run as root)"; exit 77; fi

cleanup() {
  podman rm -f -v "$name" >/dev/null 2>&1 || true
  if [ -n "${compose_up:-}" ]; then compose down -v >/dev/null 2>&1 || true; fi
  podman network rm -f "${name}_default" >/dev/null 2>&1 || true
  rm -rf "$src/dist"
}
trap cleanup EXIT

start=$SECONDS
if ! podman image exists debian:12; then
  log "making the debian:12 base image (debootstrap --variant=minbase bookworm)"
  rm -rf "$work/root"
  debootstrap --variant=minbase bookworm "$work/root" http://deb.debian.org/debian >/dev/null
  tar -C "$work/root" -c . | podman import - debian:12 >/dev/null
  rm -rf "$work/root"
fi
log "base image ready ($((SECONDS - start)) s)"

build_args=()
if [ "${DELTAFIN_PACKAGE_FROM_SOURCE:-0}" != 1 ]; then
  log "making the package (make deb)"
  make -C "$src" deb >"$work/deb.log" 2>&1 || { tail -40 "$work/deb.log"; exit 1; }
  mkdir -p "$src/dist"
  cp "$src"/build-deb/deltafin_*.deb "$src/dist/"
  deb=$(cd "$src" && ls dist/deltafin_*.deb)
  build_args=(--build-arg "DELTAFIN_DEB=$deb")
fi
log "building the image ($((SECONDS - start)) s)"
podman build --isolation=chroot --pull=never --format docker "${build_args[@]}" -t "$image" \
  -f "$src/Dockerfile" "$src" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
log "image built ($((SECONDS - start)) s)"

# One-shot runs without the image's health check (podman would schedule it with systemd timers,
# which a host without systemd as init, like this test's, cannot: it logs an error per run).
run=(podman --runtime runc run --rm --no-healthcheck --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
# The package's files, where Debian puts them.
files=$("${run[@]}" --entrypoint dpkg "$image" -L deltafin)
for f in /usr/bin/deltafin /usr/lib/x86_64-linux-gnu/libdeltafin.so.1 /usr/include/deltafin/deltafin.h \
  /usr/lib/x86_64-linux-gnu/pkgconfig/deltafin.pc /usr/lib/python3/dist-packages/deltafin/__init__.py \
  /usr/lib/python3/dist-packages/deltafin/libdeltafin.so /usr/share/doc/deltafin/README.md \
  /usr/share/doc/deltafin/DOCTOR.md /lib/systemd/system/deltafin-serve.service /etc/default/deltafin-serve; do
  grep -qx "$f" <<<"$files" || { echo "the package lacks $f"; exit 1; }
done
[ "$("${run[@]}" --entrypoint id "$image" -un)" = deltafin ] || { echo "the image does not run as deltafin"; exit 1; }
abi=$("${run[@]}" --entrypoint python3 "$image" -c 'import deltafin; print(deltafin.abi_version())')
[ "$abi" -ge 1 ] || { echo "import deltafin failed"; exit 1; }
log "package files, user and Python package OK"

out=$("${run[@]}" "$image" run --prompt "The king said" --max-new 12 --seed 3 --temperature 0.7 2>"$work/demo.err")
[ -n "$out" ] || { cat "$work/demo.err"; echo "the demo printed nothing"; exit 1; }
log "the demo in the container: ${out:0:60}..."

# serve with a model mounted read-only (the demo's files, unpacked on the host).
DELTAFIN_CACHE=$work/cache "$build/src/cli/deltafin" run --prompt x --max-new 1 >/dev/null 2>&1
model=$work/cache/demo-k3-english
[ -f "$model/config.json" ] || { echo "no demo model at $model"; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The image's health check with no timer (as above); `podman healthcheck run` runs it below.
podman --runtime runc run -d --name "$name" --health-interval disable \
  --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 -p "127.0.0.1:$port:8000" -v "$model:/models:ro" -e DELTAFIN_MODEL=/models "$image" >/dev/null
chat() {
  curl -fsS "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kimi-k3","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}'
}
wait_health() {
  for _ in $(seq 1 240); do
    curl -fsS "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}
wait_health "$port" || { podman logs "$name" | tail -20; echo "serve never became healthy"; exit 1; }
podman healthcheck run "$name" >/dev/null || { echo "the image's health check failed"; exit 1; }
reply=$(chat "$port")
grep -q '"choices"' <<<"$reply" || { echo "no chat completion: $reply"; exit 1; }
if podman exec "$name" touch /models/written 2>/dev/null; then echo "the model mount is writable"; exit 1; fi
podman rm -f -v "$name" >/dev/null
log "serve: healthy, a chat completion from the host, the model read-only ($((SECONDS - start)) s)"

# compose.yaml, as a user runs it, on a free host port (DELTAFIN_PORT). podman-compose runs
# podman with the default runtime: runc through a containers.conf of our own; and this host's
# hard limit on open files is below compose.yaml's 65536, so a second file lowers the ulimits.
compose() {
  (cd "$src" && DELTAFIN_MODEL_DIR=$model DELTAFIN_PORT=$port podman-compose -p "$name" \
    -f compose.yaml -f "$work/compose.limits.yaml" "$@")
}
if command -v podman-compose >/dev/null; then
  podman tag "$image" localhost/deltafin:latest
  printf '[engine]\nruntime = "runc"\n' >"$work/containers.conf"
  printf 'services:\n  deltafin:\n    ulimits:\n      nofile: {soft: 4096, hard: 4096}\n      nproc: {soft: 4096, hard: 4096}\n' \
    >"$work/compose.limits.yaml"
  export CONTAINERS_CONF=$work/containers.conf
  compose_up=1
  compose up -d >"$work/compose.log" 2>&1 || { tail -20 "$work/compose.log"; exit 1; }
  wait_health "$port" || { tail -20 "$work/compose.log"; echo "compose: serve never became healthy"; exit 1; }
  grep -q '"choices"' <<<"$(chat "$port")" || { echo "compose: no chat completion"; exit 1; }
  # The cache folder is the named volume, writable by the server's user.
  podman exec "${name}_deltafin_1" sh -c 'touch /var/cache/deltafin/.probe && rm /var/cache/deltafin/.probe' ||
    { echo "compose: the cache volume is not writable by the server"; exit 1; }
  podman volume exists "${name}_deltafin-cache" || { echo "compose: no cache volume"; exit 1; }
  compose down -v >/dev/null 2>&1
  compose_up=
  unset CONTAINERS_CONF
  log "compose.yaml: a chat completion on 127.0.0.1:$port, the cache on its volume"
fi

# The systemd unit against the package's own files.
if command -v systemd-analyze >/dev/null; then
  rm -rf "$work/deb-root"
  mkdir -p "$work/deb-root"
  podman create --name "$name" "$image" >/dev/null
  podman export "$name" | tar -C "$work/deb-root" -x
  podman rm -f -v "$name" >/dev/null
  # systemd's own units (sysinit.target, ...) as a Debian 12 machine with systemd has them: the
  # image is minbase, without systemd. Any message (an unknown setting, a missing binary) fails.
  cp -rn /lib/systemd/system/. "$work/deb-root/lib/systemd/system/"
  msg=$(systemd-analyze verify --root="$work/deb-root" /lib/systemd/system/deltafin-serve.service 2>&1) &&
    [ -z "$msg" ] || { echo "systemd-analyze verify: $msg"; exit 1; }
  log "systemd unit verified"
fi
log "all passed ($((SECONDS - start)) s)"
