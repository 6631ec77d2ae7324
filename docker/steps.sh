#!/bin/sh
# docker/steps.sh - the build and install steps of ferry's images, in one
# place: every RUN line of docker/Dockerfile and docker/Dockerfile.cpu calls
# it, and docker/check-build.sh runs those same RUN lines (read from
# Dockerfile.cpu) in a debootstrap root, so the proof cannot drift from the
# image. Runs as root, in the source tree (build steps) or anywhere (runtime).
#
#   steps.sh build-deps            apt-get: the Makefile's DEB_PKGS minus python3-*
#   steps.sh build [MAKEVARS...]   make -j all [MAKEVARS], then installs into /opt/ferry
#   steps.sh runtime               apt-get: the packages /opt/ferry's files link
#                                  against (listed by `build`), curl for the
#                                  health check; the ferry user and its volumes
set -eu
export DEBIAN_FRONTEND=noninteractive
apt_install() {
    apt-get update -q
    apt-get install -y -q --no-install-recommends "$@"
    rm -rf /var/lib/apt/lists/*
}
binaries() { ls /opt/ferry/ferry /opt/ferry/*.so 2>/dev/null || true; }

case "${1:-}" in
build-deps)
    # The binary needs the compiler and the -dev packages of `make deps`;
    # the python3-* ones (torch, numpy, pytest, venv, jinja2) are the tests'
    # references and the project venv, not the binary's: left out. The list
    # is read from the Makefile so that it is kept in one place.
    apt_install make
    pkgs=$(printf 'print-deb-pkgs:\n\t@echo $(DEB_PKGS)\n' | make -s -f Makefile -f - print-deb-pkgs)
    apt_install $(printf '%s\n' $pkgs | grep -v '^python3')
    ;;
build)
    shift
    make -j"$(nproc)" all "$@"
    ./build/ferry --help > /dev/null
    mkdir -p /opt/ferry
    cp build/ferry /opt/ferry/
    # ferry finds libferry_cuda.so next to itself (engine/backend.c)
    [ ! -e build/libferry_cuda.so ] || cp build/libferry_cuda.so /opt/ferry/
    # the Debian/Ubuntu packages owning what they link against; CUDA's own
    # libraries (/usr/local/cuda*) come with NVIDIA's runtime image instead
    for lib in $(ldd $(binaries) | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | grep -v '^/usr/local/cuda' | sort -u); do
        dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null ||
            dpkg -S "${lib#/usr}" 2>/dev/null || { echo "steps.sh: no package owns $lib" >&2; exit 1; }
    done | cut -d: -f1 | sort -u > /opt/ferry/runtime-packages
    echo "runtime packages: $(tr '\n' ' ' < /opt/ferry/runtime-packages)"
    ;;
runtime)
    apt_install curl $(cat /opt/ferry/runtime-packages)
    if ldd $(binaries) | grep 'not found'; then echo "steps.sh: unresolved libraries" >&2; exit 1; fi
    /opt/ferry/ferry --help > /dev/null
    useradd --no-create-home --no-log-init --uid 10001 --user-group --home-dir /var/lib/ferry --shell /usr/sbin/nologin ferry
    mkdir -p /models /var/lib/ferry/offload /var/lib/ferry/exports
    chown -R ferry:ferry /var/lib/ferry
    ;;
*)
    echo "usage: steps.sh build-deps | build [MAKEVARS...] | runtime" >&2
    exit 2
    ;;
esac
