#!/usr/bin/env bash
# Set up a machine for turbo-llama: system packages, a venv at .venv, and the package itself.
#   bash ci/setup.sh            (then use .venv/bin/turbo-llama, or `. .venv/bin/activate`)
# Safe to rerun; skips what is already there. Needs root (or sudo) only for missing apt packages.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(ccache git g++)   # ccache: fast rebuilds (the eval's texts ship with the package: no apt needed)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "== apt: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "== apt: ${APT_PACKAGES[*]} present"
fi

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "turbo-llama needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
    echo "== venv: .venv ($("$PY" --version))"
    "$PY" -m venv .venv
fi
echo "== pip install .[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check ".[test]"
echo "== ready: $(.venv/bin/turbo-llama --version)"
