# Sourced by scripts/build and scripts/test_wheel (after setting $root): compile through ccache where it is
# installed (scripts/setup installs it). CCACHE_BASEDIR makes the paths under the repository relative to the
# build folder in what ccache hashes, so build/ and build-wheel/ (folders at the same depth) share the objects
# whose flags agree, and the wheel's CMake build compiles only what differs from build/'s.
ccache_args=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$root"
  ccache_args=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
