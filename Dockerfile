# Deltafin's container image: `deltafin serve` on 0.0.0.0:8000 as an unprivileged user, the model
# mounted read-only. Two stages: `build` compiles on Debian 12 and makes the Debian package
# (`make deb`: the binary with the web page inside, libdeltafin.so, the header and pkg-config
# file, the Python package, the docs); `runtime` is Debian 12 with that package installed (its
# runtime dependencies come from the package), Python with numpy for the Python package, the
# Vulkan loader (opened at run time with --gpu) and curl for the health check.
#
#   podman build -t deltafin .            (docker build works the same)
#   podman run -p 8000:8000 -v /path/to/Kimi-K3:/models:ro -e DELTAFIN_MODEL=/models deltafin
#
# Without a model the built-in demo serves. README "Run in a container" has the rest (compose,
# GPUs). tests/package/package_test.sh builds and runs it with podman.
ARG BASE=debian:12

FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# DELTAFIN_DEB: the path (in the build context) of a package `make deb` already made on Debian 12;
# the stage then only copies it (the package test uses this to avoid compiling twice).
ARG DELTAFIN_DEB=
WORKDIR /src
COPY . .
RUN mkdir -p /out && if [ -n "$DELTAFIN_DEB" ]; then cp "$DELTAFIN_DEB" /out/; else \
      apt-get update -qq && apt-get install -y -qq --no-install-recommends make && \
      make deps-build && make deb JOBS="$(nproc)" && cp build-deb/deltafin_*.deb /out/; fi

FROM ${BASE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/ /tmp/deb/
RUN apt-get update -qq && \
    apt-get install -y -qq --no-install-recommends /tmp/deb/deltafin_*.deb python3 python3-numpy \
      libvulkan1 curl ca-certificates && \
    rm -rf /var/lib/apt/lists/* /tmp/deb
# The package's postinst made the `deltafin` user and its folders. The cache folder holds the
# unpacked demo model and the expert heat statistics (kept across restarts on a volume).
ENV DELTAFIN_CACHE=/var/cache/deltafin HOME=/var/lib/deltafin
VOLUME ["/var/cache/deltafin"]
USER deltafin
WORKDIR /var/lib/deltafin
EXPOSE 8000
# /health answers 200 once the model is loaded (K3 takes minutes to read its resident trunk).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/health || exit 1
ENTRYPOINT ["deltafin"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
