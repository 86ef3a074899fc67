#!/usr/bin/env bash
# Installs everything turbotrain needs on a fresh Debian machine with Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1 && { [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || [ ! -e /usr/share/wordnet/data.noun ]; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq dataset-fashion-mnist wordnet-base >/dev/null
fi
python -m pip install -q --disable-pip-version-check -r requirements.txt
