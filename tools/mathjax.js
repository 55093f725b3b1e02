// Typeset the pages' formulas with the MathJax copied next to this file by tools/docs.sh (no network).
// Notebook pages load this file twice (as mkdocs-jupyter's custom_mathjax_url and as mkdocs' extra_javascript for
// the markdown pages), hence the guard. Delimiters: the notebooks' $...$ and $$...$$, pymdownx.arithmatex's \(...\)
// and \[...\]; SVG output needs no font files (Chromium refuses web fonts from file:// pages).
if (!window.MathJax) {
  window.MathJax = {
    tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']],
          processEscapes: true, processEnvironments: true},
    svg: {fontCache: 'global'},
  };
  const script = document.createElement('script');
  script.src = document.currentScript.src.replace(/[^/]*$/, 'tex-svg-full.js');
  script.async = true;
  document.head.appendChild(script);
}
