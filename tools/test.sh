#!/usr/bin/env bash
# Install the test tools and the extras the tests use into .venv (made by tools/setup.sh), then run both suites: the
# notebooks (every code cell must compile, which nbdev_test does not check; then nbdev_test, skipping cells flagged
# slow) and tests/.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install -q -e '.[dev,video,ray,sb3,zoo,cleanrl]'
.venv/bin/python tools/check_cells.py
.venv/bin/nbdev_test --n_workers 2
.venv/bin/python -m pytest -q -p no:cacheprovider tests
