# Sourced by launch/setup.sh and launch/fuzz.sh (not run): ensure_debian_packages PKG... installs
# the missing ones when running as root with apt-get (unless SCMOE_SKIP_INSTALL=1), else prints the
# command that would and exits 2. Uses the caller's say() for progress.
ensure_debian_packages() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -eq 0 ]; then
    say "Debian packages present"
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ "${SCMOE_SKIP_INSTALL:-0}" != 1 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "error: missing Debian packages: ${missing[*]}" >&2
    echo "install them, then run this command again:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
}
