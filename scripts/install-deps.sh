#!/usr/bin/env bash
# Installs epcomm's build and test dependencies from Debian's packages (as
# root, or through sudo). The one list that README.md and .ci/run both use.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config doctest-dev librange-v3-dev
          libfabric-dev libucx-dev libopenmpi-dev openmpi-bin
          clang libclang-rt-14-dev
          pybind11-dev libdlpack-dev python3-dev python3-torch python3-pytest
          python3-yaml)

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi

all_installed() {
  local status
  status=$(dpkg-query -W -f='${db:Status-Status}\n' "${packages[@]}" 2>/dev/null) || return 1
  [[ $(grep -cx installed <<<"$status") -eq ${#packages[@]} ]]
}

if all_installed; then
  echo "install-deps: everything is installed already"
else
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${packages[@]}"
fi
