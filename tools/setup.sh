#!/usr/bin/env bash
# Create .venv and install fastrl_per with what the main job (`fastrl_per train`) needs: the cli extra (progress bar,
# plot, TensorBoard). torch's 2.13.0 build goes in first so that nothing later pulls a different one.
# tools/test.sh adds the test tools and the extras the tests use (dev, video, ray, atari).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[cli]'
