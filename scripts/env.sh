# Sourced by scripts/build and scripts/test (POSIX sh).
# Compiles go through ccache (meson picks it up from PATH) with the cache outside the clone
# and keyed on paths relative to it: a fresh clone anywhere on this machine (CI's) reuses the
# compiles of every earlier build.
export CCACHE_DIR="${CCACHE_DIR:-/var/cache/berth-ccache}"
export CCACHE_BASEDIR="$(pwd)"
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
