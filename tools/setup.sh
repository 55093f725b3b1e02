#!/usr/bin/env bash
# Create .venv and install fastrl_per with its dev tools. torch's 2.13.0 build goes in
# first so that nothing later pulls a different (multi-GB) build; the video extra lets the
# tests record an evaluation.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev,video,ray]'
