#!/usr/bin/env bash
# System packages the tests need beyond Python: bubblewrap (`bwrap`) for the run_python sandbox
# (SPEC T-1). Idempotent: installs only what is missing. With CI set a failed install fails the
# run; elsewhere it only warns (the sandbox tests then skip with a message).
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ ${#missing[@]} -eq 0 ]; then
  echo "system-deps: bubblewrap is installed"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; fi
fi
status=1
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
  echo "system-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || { $sudo apt-get update -qq >/dev/null 2>&1 \
         && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; }
  command -v bwrap >/dev/null 2>&1 && status=0
fi
if [ $status -ne 0 ]; then
  echo "system-deps: could not install ${missing[*]} (apt-get install ${missing[*]})"
  [ -n "${CI:-}" ] && exit 1
fi
exit 0
