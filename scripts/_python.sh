# Sourced by scripts/install and scripts/test: which Python environment busd lives in, and the
# build tools python-qpid-proton needs (it ships as source only: a C compiler and OpenSSL's
# headers build it at install).

# $PYTHON when set (an environment of the caller's choosing, as .ci/run does), else the
# repository's .venv.
busd_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
    else
        echo ".venv/bin/python"
    fi
}

# Make .venv with a Python 3.11 or later, unless $PYTHON names another environment.
ensure_venv() {
    [ -n "${PYTHON:-}" ] && return 0
    [ -x .venv/bin/python ] && return 0
    local base="${BUSD_BASE_PYTHON:-python3}"
    if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "busd needs Python 3.11 or later; $base is $("$base" --version 2>&1)" >&2
        echo "(BUSD_BASE_PYTHON=/path/to/python3.11 scripts/install uses another one)" >&2
        exit 1
    fi
    if ! "$base" -m venv .venv 2>/dev/null; then
        # Debian and Ubuntu ship venv's pip bootstrap apart
        rm -rf .venv
        apt_install python3-venv
        "$base" -m venv .venv
    fi
    .venv/bin/python -m pip install -q --upgrade pip
}

# Run apt-get install as root, or with sudo; say what is missing where there is no apt-get.
apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! command -v sudo >/dev/null 2>&1; }; then
        echo "busd: install $* (or your system's equivalent) and run this again" >&2
        return 1
    fi
    echo "installing $* with apt-get"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# A C compiler and OpenSSL's headers, unless python-qpid-proton is built already.
ensure_build_tools() {
    local python="$1"
    "$python" -c "import proton" 2>/dev/null && return 0
    if command -v cc >/dev/null 2>&1 && { [ -e /usr/include/openssl/ssl.h ] \
            || pkg-config --exists openssl 2>/dev/null; }; then
        return 0
    fi
    apt_install build-essential libssl-dev pkg-config || {
        echo "busd: python-qpid-proton builds from source: it needs a C compiler and" \
             "OpenSSL's headers (e.g. dnf install gcc openssl-devel; brew install openssl)" >&2
        return 1
    }
}

# Debian's jemalloc, which the embedded Valkey preloads when present (busd/storage/redis/embedded.py):
# installed with apt-get as root, or with sudo when it needs no password; it is optional, so
# anywhere else this only says how to get it.
ensure_jemalloc() {
    local library
    for library in /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib/libjemalloc.so.2; do
        [ -r "$library" ] && return 0
    done
    if command -v apt-get >/dev/null 2>&1 \
            && { [ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; }; then
        apt_install libjemalloc2 && return 0
    fi
    echo "busd: the embedded Valkey runs faster with jemalloc" \
         "(apt-get install libjemalloc2; the banner says which allocator it uses)" >&2
    return 0
}
