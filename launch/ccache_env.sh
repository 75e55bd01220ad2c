# Sourced (not run) by launch/setup.sh, launch/run_tests.sh and launch/fuzz.sh: compile through ccache
# when it is installed (setup.sh installs it), so a build of sources compiled before on this machine
# (CI run again, a sanitizer or bundle build of unchanged files) takes its objects from the cache.
# CMake reads these variables when it configures a new build folder; an existing folder keeps the
# launcher it was configured with. SCMOE_CCACHE=0 turns it off; CCACHE_DIR and CCACHE_MAXSIZE are
# ccache's own (defaults here: ccache's folder, 10G: a CUDA build for two architectures fills ~2G).
# CCACHE_BASEDIR is the checkout (the scripts run from its root) and CCACHE_NOHASHDIR is set, so two
# clones in different folders (every CI run is a fresh clone) share their entries: ccache then hashes
# paths relative to the checkout and leaves the working directory out of -g builds' hash.
if [ "${SCMOE_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd -P)}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
fi
