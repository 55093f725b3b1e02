#!/usr/bin/env bash
# Build the documentation site into _docs/ (open _docs/index.html): run every notebook in nbs/ into _proc/,
# skipping cells flagged slow, with an API section per module (tools/docs.py), then render _proc/ with mkdocs
# in strict mode. Fails if a notebook cell raises or a page does not build.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf _proc _docs
.venv/bin/python tools/docs.py
cp tools/docs.css _proc/
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
for nb in nbs/*.ipynb; do
  page="_docs/$(basename "${nb%.ipynb}").html"
  [ -s "$page" ] || { echo "no page for $nb"; exit 1; }
done
echo "docs built: open _docs/index.html"
