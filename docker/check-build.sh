#!/bin/bash
# docker/check-build.sh - proves docker/Dockerfile.cpu without a Docker
# engine: reads the Dockerfile and carries out its instructions itself, each
# stage in a fresh Debian bookworm root made once with debootstrap
# (--variant=minbase, copied per stage: the stand-in for debian:bookworm-slim),
# RUN lines with chroot, COPY from the checkout or the build stage. Then it
# serves a `ferry mkmodel` model from the final root as the image would:
# ENTRYPOINT + CMD as USER, the model read-only at /models, ferry as PID 1
# of its own PID namespace in a network namespace of its own (port 8000 is
# the image's, whatever else this machine runs), until the HEALTHCHECK
# command answers; then SIGTERM, and ferry must drain and exit 0.
#
# Run as root from anywhere: docker/check-build.sh (KEEP=1 keeps the work
# directory; MIRROR= another Debian mirror). Slow (minutes): not in `make test`.
# Differs from a real `docker build`: minbase is not the slim image byte for
# byte (same suite and essential packages, no security suite), no layer
# cache, the build context is the checkout, not a .dockerignore'd copy.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "check-build.sh: run as root (debootstrap, chroot, mount, unshare)" >&2; exit 2; }
cd "$(dirname "$0")/.."
SRC=$PWD
DOCKERFILE=${DOCKERFILE:-docker/Dockerfile.cpu}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORK=$(mktemp -d /var/tmp/ferry-check.XXXXXX)
MOUNTS=()
SERVER=
T0=$(date +%s)
lap() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

cleanup() {
    local rc=$?
    [ -z "$SERVER" ] || ! kill -0 "$SERVER" 2>/dev/null || kill -KILL "$SERVER"
    for (( i=${#MOUNTS[@]}-1; i>=0; i-- )); do umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"; done
    if [ "${KEEP:-0}" = 1 ] || grep -q " $WORK/" /proc/mounts; then echo "kept $WORK"; else rm -rf "$WORK"; fi
    lap "exit $rc"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v debootstrap > /dev/null || apt-get install -y -q debootstrap > /dev/null

# instructions one a line (continuations joined, comments dropped)
instructions() {
    awk '/^[[:space:]]*#/ { next }
         { if (sub(/\\$/, "")) { buf = buf $0; next } print buf $0; buf = "" }' "$DOCKERFILE" | grep -v '^[[:space:]]*$'
}
json_words() { python3 -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])))' "$1"; }

lap "debootstrap bookworm (minbase) from $MIRROR"
debootstrap --variant=minbase bookworm "$WORK/base" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log"; exit 1; }
cp /etc/resolv.conf "$WORK/base/etc/resolv.conf"

declare -A STAGES   # stage name -> root
n=0 runs=0 root= workdir=/ user=root path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
envs=() entry=() cmd=() health=()
while read -r op args; do
    case "${op^^}" in
    FROM)
        read -r image _as name <<< "$args"
        [ "$image" = debian:bookworm-slim ] || { echo "check-build.sh: only debian:bookworm-slim stages, not $image" >&2; exit 1; }
        root=$WORK/stage$n; n=$((n + 1))
        STAGES[${name:-$n}]=$root
        cp -a "$WORK/base" "$root"
        mount -t proc proc "$root/proc"; MOUNTS+=("$root/proc")
        workdir=/ user=root envs=() entry=() cmd=() health=()
        lap "FROM $args -> $root" ;;
    WORKDIR)
        workdir=$args; mkdir -p "$root$workdir" ;;
    ENV)
        envs+=("${args//\$PATH/$path}")
        case "$args" in PATH=*) path=${args#PATH=}; path=${path//\$PATH/$path} ;; esac ;;
    USER)
        user=$args ;;
    COPY)
        from=$SRC
        case "$args" in --from=*) s=${args%% *}; from=${STAGES[${s#--from=}]}; args=${args#* } ;; esac
        read -ra words <<< "$args"
        dest=${words[-1]}; [ "${dest:0:1}" = / ] || dest=$workdir/$dest
        for s in "${words[@]:0:${#words[@]}-1}"; do
            if [ -d "$from/$s" ]; then mkdir -p "$root$dest"; cp -a "$from/$s/." "$root$dest/"
            else mkdir -p "$(dirname "$root$dest")"; cp -a "$from/$s" "$root$dest"; fi
        done
        lap "COPY $args" ;;
    RUN)
        lap "RUN $args"
        log=$WORK/run$((++runs)).log
        chroot "$root" /usr/bin/env -i HOME=/root PATH="$path" "${envs[@]}" /bin/sh -c "cd $workdir && $args" \
            < /dev/null > "$log" 2>&1 || { tail -30 "$log"; echo "check-build.sh: RUN failed" >&2; exit 1; }
        grep -h '^runtime packages:' "$log" | sed 's/^/   /' || true ;;
    HEALTHCHECK)
        mapfile -t health < <(json_words "${args#*CMD }") ;;
    ENTRYPOINT)
        mapfile -t entry < <(json_words "$args") ;;
    CMD)
        mapfile -t cmd < <(json_words "$args") ;;
    *)
        echo "   ($op not carried out: $args)" ;;
    esac
done < <(instructions)
for m in "${!MOUNTS[@]}"; do umount "${MOUNTS[m]}"; done; MOUNTS=()
lap "image root built: $(du -sh --exclude=proc "$root" | cut -f1) (the build stage's is $(du -sh "$WORK/stage0" | cut -f1))"

# the model, written by the image's own ferry, then bound read-only at /models
chroot "$root" /opt/ferry/ferry mkmodel --preset tiny --out /models < /dev/null > /dev/null
mount --bind "$root/models" "$root/models"; MOUNTS+=("$root/models")
mount -o remount,bind,ro "$root/models"
lap "model made; serving: ${entry[*]} ${cmd[*]} (as $user, in $workdir)"
unshare --net --pid --fork --mount-proc="$root/proc" \
    chroot --userspec="$user" "$root" /usr/bin/env -i HOME=/var/lib/ferry PATH="$path" "${envs[@]}" \
    /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "${entry[@]}" "${cmd[@]}" > "$WORK/serve.log" 2>&1 &
SERVER=$!
FERRY=
for _ in $(seq 50); do FERRY=$(pgrep -P "$SERVER" || true); [ -n "$FERRY" ] && break; sleep 0.1; done
[ -n "$FERRY" ] || { cat "$WORK/serve.log"; echo "check-build.sh: ferry did not start" >&2; exit 1; }
in_ns() { nsenter --net="/proc/$FERRY/ns/net" "$@"; }
in_ns ip link set lo up
ready=0
for _ in $(seq 120); do
    if in_ns chroot --userspec="$user" "$root" "${health[@]}"; then ready=1; break; fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
done
[ $ready = 1 ] || { cat "$WORK/serve.log"; echo "check-build.sh: /v2/health/ready never answered 200" >&2; exit 1; }
lap "HEALTHCHECK passed: ${health[*]}"
in_ns chroot --userspec="$user" "$root" curl -sS -w ' %{http_code}\n' http://127.0.0.1:8000/v2/health/ready
echo "   ferry is PID $(awk '{ print $NF }' < <(grep NSpid "/proc/$FERRY/status")) in its namespace, user $(stat -c %u "/proc/$FERRY")"
kill -TERM "$FERRY"
rc=0; wait "$SERVER" || rc=$?; SERVER=
sed 's/^/   serve: /' "$WORK/serve.log"
[ $rc = 0 ] && grep -q '^ferry: stopped' "$WORK/serve.log" ||
    { echo "check-build.sh: ferry did not stop cleanly on SIGTERM (exit $rc)" >&2; exit 1; }
lap "SIGTERM: drained and exited 0; all steps passed"
