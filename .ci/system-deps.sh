#!/usr/bin/env bash
# System packages the tests need beyond Python: bubblewrap (`bwrap`) for the run_python sandbox
# (SPEC T-1), and Debian's Chromium (`/usr/bin/chromium`) for the web console's browser tests
# (Playwright drives it; no browser download). Idempotent: installs only what is missing. With
# CI set a failed install fails the run; elsewhere it only warns (those tests then skip with a
# message).
set -u
have_bwrap() { command -v bwrap >/dev/null 2>&1; }
have_chromium() { [ -x /usr/bin/chromium ]; }
missing=()
have_bwrap || missing+=(bubblewrap)
have_chromium || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
  echo "system-deps: bubblewrap and chromium are installed"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; fi
fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
  echo "system-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || { $sudo apt-get update -qq >/dev/null 2>&1 \
         && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; }
fi
still=()
have_bwrap || still+=(bubblewrap)
have_chromium || still+=(chromium)
if [ ${#still[@]} -ne 0 ]; then
  echo "system-deps: could not install ${still[*]} (apt-get install ${still[*]})"
  [ -n "${CI:-}" ] && exit 1
fi
exit 0
