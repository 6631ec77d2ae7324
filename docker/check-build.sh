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
# The configuration: the image must set no FERRY_<NAME> variable but
# FERRY_CONFIG (env beats the file: it would override an operator's mounted
# file), `ferry config --print` in the image must show every setting of
# the image's config file as read from it, and each override an operator
# has (-e FERRY_<NAME>, flags after the image name, their own file mounted
# over the image's) must win; the served model's name must be the file's
# (CMD is only "serve") and the admin API must start with FERRY_ADMIN_TOKEN
# from the environment.
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
        case "$args" in
        FERRY_CONFIG=*) ;;
        FERRY_*) echo "check-build.sh: ENV $args: a FERRY_<NAME> variable in the image would override an operator's config file (env beats file); put it in the image's config file" >&2; exit 1 ;;
        esac
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
        chown -R 0:0 "$root$dest"   # COPY without --chown: owned by root, modes kept
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
lap "model made"

# The configuration. `config --print` with CMD's flags shows what CMD's
# serve runs with, as `docker run IMAGE config --print` would.
config_file=
for e in "${envs[@]}"; do case "$e" in FERRY_CONFIG=*) config_file=${e#FERRY_CONFIG=} ;; esac; done
[ -n "$config_file" ] && [ -f "$root$config_file" ] ||
    { echo "check-build.sh: the image names no config file (ENV FERRY_CONFIG=...) or does not hold it" >&2; exit 1; }
[ "${cmd[0]:-}" = serve ] || { echo "check-build.sh: CMD runs '${cmd[0]:-}', not serve" >&2; exit 1; }
print_cmd=(config "${cmd[@]:1}" --print)
in_image() { chroot --userspec="$user" "$root" /usr/bin/env -i HOME=/var/lib/ferry PATH="$path" "${envs[@]}" "$@"; }
# `config --print` JSON -> one "name=value (source)" a line; a file's source is "file PATH"
settings() {
    python3 -c 'import json, sys
for k, s in json.load(sys.stdin)["settings"].items():
    v = s["value"] if isinstance(s["value"], str) else json.dumps(s["value"])
    src = s["source"] + (" " + s["from"].rsplit(":", 1)[0] if s["source"] == "file" else "")
    print(f"{k}={v} ({src})")'
}
# a config file's settings (comments left out) as settings() prints them
file_settings() {   # FILE, the path it has in the image
    python3 -c 'import json, sys
for k, v in json.load(open(sys.argv[1])).items():
    if not k.startswith("//"):
        print(f"{k}={v if isinstance(v, str) else json.dumps(v)} (file {sys.argv[2]})")' "$@"
}
file_value() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$@"; }
expect() {   # WHAT, `config --print` output, then the lines it must hold
    local what=$1 out; out=$(settings <<< "$2"); shift 2
    for want in "$@"; do
        grep -qxF -- "$want" <<< "$out" ||
            { sed 's/^/   /' <<< "$out"; echo "check-build.sh: $what: not '$want'" >&2; exit 1; }
    done
    echo "   $what:"; printf '     %s\n' "$@"
}
mapfile -t image_settings < <(file_settings "$root$config_file" "$config_file")
for k in model name; do
    printf '%s\n' "${image_settings[@]}" | grep -q "^$k=" ||
        { echo "check-build.sh: $config_file sets no $k (CMD is only serve: it must)" >&2; exit 1; }
done
out=$(in_image "${entry[@]}" "${print_cmd[@]}") || { echo "check-build.sh: ferry ${print_cmd[*]} failed" >&2; exit 1; }
expect "the image's $config_file, as CMD runs" "$out" "${image_settings[@]}"
# -e FERRY_<NAME> beats the file; a flag after the image name beats both
out=$(in_image FERRY_MAX_MEMORY=device=20GiB FERRY_NAME=env-name "${entry[@]}" config --print --name flag-name) ||
    { echo "check-build.sh: ferry config --print with FERRY_MAX_MEMORY, FERRY_NAME and --name failed" >&2; exit 1; }
expect "-e FERRY_MAX_MEMORY=device=20GiB -e FERRY_NAME=env-name, then serve --name flag-name" "$out" \
    "max_memory=device=20GiB (env)" "name=flag-name (flag)" "$(printf '%s\n' "${image_settings[@]}" | grep '^model=')"
# an operator's own file mounted over the image's replaces it (no merge)
printf '{\n  "model": "/models",\n  "name": "operator-model",\n  "max_memory": "device=1GiB,host=0"\n}\n' > "$WORK/operator.json"
chmod 0644 "$WORK/operator.json"
mapfile -t operator_settings < <(file_settings "$WORK/operator.json" "$config_file")
out=$(unshare --mount /bin/sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' _ "$WORK/operator.json" "$root$config_file" \
        chroot --userspec="$user" "$root" /usr/bin/env -i HOME=/var/lib/ferry PATH="$path" "${envs[@]}" "${entry[@]}" "${print_cmd[@]}") ||
    { echo "check-build.sh: ferry ${print_cmd[*]} failed with operator.json mounted at $config_file" >&2; exit 1; }
expect "-v operator.json:$config_file:ro (it replaces the image's file: export_dir back to its default)" "$out" \
    "${operator_settings[@]}" "export_dir=null (default)"
lap "config: the image's file read, each override wins"

# serve as the image would, plus an admin token from the environment (the
# compose and Kubernetes files' way: a secret, never a flag)
name=$(file_value "$root$config_file" name)
dir_name=$(basename "$(file_value "$root$config_file" model)")
[ "$name" != "$dir_name" ] ||
    { echo "check-build.sh: the file's name is the model directory's: the served name would not show the file was read" >&2; exit 1; }
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
lap "serving: ${entry[*]} ${cmd[*]} (as $user, in $workdir; FERRY_ADMIN_TOKEN set)"
unshare --net --pid --fork --mount-proc="$root/proc" \
    chroot --userspec="$user" "$root" /usr/bin/env -i HOME=/var/lib/ferry PATH="$path" "${envs[@]}" FERRY_ADMIN_TOKEN="$token" \
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
in_image_ns() { in_ns chroot --userspec="$user" "$root" "$@"; }
meta=$(in_image_ns curl -fsS "http://127.0.0.1:8000/v2/models/$name") ||
    { cat "$WORK/serve.log"; echo "check-build.sh: no model '$name' (the config file's name) served" >&2; exit 1; }
[ "$(python3 -c 'import json, sys; print(json.load(sys.stdin)["name"])' <<< "$meta")" = "$name" ] ||
    { echo "$meta"; echo "check-build.sh: /v2/models/$name names another model" >&2; exit 1; }
echo "   GET /v2/models/$name: 200, name \"$name\" (the config file's; without it, the model directory's \"$dir_name\")"
admin=$(in_image_ns curl -fsS -H "Authorization: Bearer $token" http://127.0.0.1:8003/admin/v1/status) ||
    { cat "$WORK/serve.log"; echo "check-build.sh: the admin API did not answer with FERRY_ADMIN_TOKEN set" >&2; exit 1; }
code=$(in_image_ns curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:8003/admin/v1/status)
[ "$code" = 401 ] || { echo "check-build.sh: the admin API answered $code without the token" >&2; exit 1; }
exports=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["export_dir"])' <<< "$admin")
[ "$exports" = "$(file_value "$root$config_file" export_dir)" ] ||
    { echo "$admin"; echo "check-build.sh: the admin API's export_dir is not the config file's" >&2; exit 1; }
echo "   admin API (FERRY_ADMIN_TOKEN from the environment): status 200 with the token, 401 without; export_dir $exports (the file's)"
echo "   ferry is PID $(awk '{ print $NF }' < <(grep NSpid "/proc/$FERRY/status")) in its namespace, user $(stat -c %u "/proc/$FERRY")"
kill -TERM "$FERRY"
rc=0; wait "$SERVER" || rc=$?; SERVER=
sed 's/^/   serve: /' "$WORK/serve.log"
[ $rc = 0 ] && grep -q '^ferry: stopped' "$WORK/serve.log" ||
    { echo "check-build.sh: ferry did not stop cleanly on SIGTERM (exit $rc)" >&2; exit 1; }
lap "SIGTERM: drained and exited 0; all steps passed"
