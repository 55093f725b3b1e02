#!/usr/bin/env bash
# Build the documentation site into _docs/ (open _docs/index.html): run every notebook in nbs/ into _proc/, skipping
# cells flagged slow, with an API section per module (tools/docs.py), add the markdown pages of docs/, then render
# _proc/ with mkdocs in strict mode. Fails if a notebook cell raises or does not compile, or a page does not build.
# Formulas are typeset by MathJax 3 from npm (the registry's tarball, checked by npm), kept in .cache/ and copied into
# the site, so the pages show them offline. tools/check_site.py checks the result.
# Run it after tools/setup.sh: it first installs into .venv what it needs (nbdev, execnb and mkdocs from the dev extra,
# and the extras the notebooks import: the same as tools/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install -q -e '.[dev,video,ray,sb3,zoo,cleanrl]'
rm -rf _proc _docs
.venv/bin/python tools/docs.py
cp tools/docs.css _proc/
cp -r docs _proc/docs       # the pages that are not notebooks: runs, benchmarks
mathjax=.cache/mathjax-3.2.2
if [ ! -s "$mathjax/package/es5/tex-svg-full.js" ]; then
  mkdir -p "$mathjax"
  (cd "$mathjax" && npm pack --silent mathjax@3.2.2 >/dev/null &&
    tar xzf mathjax-3.2.2.tgz package/es5/tex-svg-full.js package/LICENSE)
fi
mkdir -p _proc/assets/mathjax
cp "$mathjax/package/es5/tex-svg-full.js" "$mathjax/package/LICENSE" _proc/assets/mathjax/
cp tools/mathjax.js _proc/assets/mathjax/load.js
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
for nb in nbs/*.ipynb; do
  page="_docs/$(basename "${nb%.ipynb}").html"
  [ -s "$page" ] || { echo "no page for $nb"; exit 1; }
done
for md in docs/*.md; do
  [ -s "_docs/${md%.md}.html" ] || { echo "no page for $md"; exit 1; }
done
echo "docs built: open _docs/index.html"
