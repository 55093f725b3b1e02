"""Check the built site in _docs/ for what a reader would see wrong (run after tools/docs.sh):
- a page whose math script is empty (`<script src="">`) or missing, or a MathJax file absent from the site;
- TeX outside the delimiters MathJax typesets: `$$`, `\\frac` or `\\sum` left in a paragraph once its `$...$`,
  `$$...$$`, `\\(...\\)` and `\\[...\\]` spans are taken out (code and scripts are not looked at);
- an error shown under a cell (a traceback, `SyntaxError`, `...Error:` in an output);
- a notebook page (one per nbs/*.ipynb) with no output under any cell.
With `--browser` it also opens every page in headless Chromium, lets MathJax run, and fails on a page whose
formulas were not typeset (TeX left in the text, or math delimiters and no typeset formula), and on a table wider
than the text column in a 1280 px window (it would be cut off behind a scroll bar: tools/docs.css wraps tables).
Usage: python tools/check_site.py [--browser]; exits 1 listing every problem, else prints the counts."""
import html, json, re, subprocess, sys
from html.parser import HTMLParser
from pathlib import Path

root = Path(__file__).parent.parent
site = root/'_docs'
MATH_JS = ('assets/mathjax/load.js', 'assets/mathjax/tex-svg-full.js')
_re_math = re.compile(r'\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\\$])\$[^$\n]+?\$', re.DOTALL)
_re_raw_tex = re.compile(r'\$\$|\\frac|\\sum')
_re_error = re.compile(r'^(Traceback \(most recent call last\)|\s*\w*(Error|Exception): )', re.MULTILINE)
SKIP_TAGS = {'script', 'style', 'code', 'pre', 'svg', 'mjx-container', 'textarea'}
BLOCK_TAGS = {'p', 'li', 'td', 'th', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'div', 'blockquote', 'dt', 'dd'}
VOID_TAGS = {'area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link', 'meta', 'source', 'track', 'wbr'}

class Page(HTMLParser):
    "What the checks need of one page: math scripts, paragraph texts, output texts, and counts of outputs and images."
    def __init__(self, html):
        super().__init__(convert_charrefs=True)
        self.stack, self.scripts, self.blocks, self.outputs, self.images = [], [], [''], [], 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == 'script': self.scripts.append(attrs.get('src'))
        if tag == 'img': self.images += 1
        if tag in VOID_TAGS: return
        cls = attrs.get('class') or ''
        is_output = 'jp-OutputArea-child' in cls.split()
        if is_output: self.outputs.append('')
        self.stack.append((tag, is_output))
        if tag in BLOCK_TAGS: self.blocks.append('')

    def handle_endtag(self, tag):
        while self.stack:  # HTML is forgiving about end tags: close up to the matching one
            t, _ = self.stack.pop()
            if t == tag: break
        if tag in BLOCK_TAGS: self.blocks.append('')

    def handle_data(self, data):
        in_output = any(o for _, o in self.stack)
        if in_output: self.outputs[-1] += data
        if not any(t in SKIP_TAGS for t, _ in self.stack) and not in_output: self.blocks[-1] += data

def raw_tex(text):
    "The TeX left in `text` once its typeset spans are taken out, or None."
    rest = _re_math.sub(' ', text)
    return rest if _re_raw_tex.search(rest) else None

def page_problems(path, notebook_page):
    "The problems of the page at `path`, and its counts of outputs and images."
    page, name, res = Page(path.read_text()), path.name, []
    if '' in page.scripts: res.append(f'{name}: an empty <script src="">')
    if notebook_page and not any(s and s.endswith(MATH_JS[0]) for s in page.scripts):
        res.append(f'{name}: no math script ({MATH_JS[0]})')
    for block in page.blocks:
        if (rest := raw_tex(block)): res.append(f'{name}: TeX outside math delimiters: {" ".join(rest.split())[:120]}')
    for out in page.outputs:
        if (m := _re_error.search(out)): res.append(f'{name}: an error output: {m.group(0).strip()[:120]}')
    if notebook_page and not page.outputs: res.append(f'{name}: a notebook page without any output')
    return res, len(page.outputs), page.images

def browser_problems(path, chromium='chromium'):
    "Problems once MathJax has run in headless Chromium: TeX left in the text, or math and no typeset formula."
    dom = subprocess.run([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--virtual-time-budget=10000',
                          '--dump-dom', path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    page, res = Page(dom), []
    rest = [r for b in page.blocks if (r := raw_tex(b))]
    if rest: res.append(f'{path.name} in Chromium: TeX not typeset: {" ".join(rest[0].split())[:120]}')
    has_math = any(_re_math.search(b) for b in Page(path.read_text()).blocks)
    if has_math and '<mjx-container' not in dom: res.append(f'{path.name} in Chromium: formulas, none typeset')
    return res

WIDTH = 1280   # the window a reader's laptop gives the page
MEASURE = """<!doctype html><html><body style="margin:0"><pre id="out">not measured</pre>
<iframe id="page" style="width:%dpx;height:900px;border:0"></iframe>
<script>
const frame = document.getElementById('page');
frame.onload = () => {
  const wide = [];
  for (const t of frame.contentDocument.querySelectorAll('article table')) {
    const column = t.closest('article').getBoundingClientRect(), box = t.getBoundingClientRect();
    if (box.right > column.right + 1)
      wide.push(`${Math.round(box.width)} px in a ${Math.round(column.width)} px column: ${t.rows[0].textContent}`);
  }
  document.getElementById('out').textContent = 'WIDE ' + JSON.stringify(wide);
};
frame.src = location.hash.slice(1);
</script></body></html>""" % WIDTH

def wide_tables(path, measure, chromium='chromium'):
    ("The tables of the page at `path` wider than its text column at `WIDTH` px, measured in headless Chromium by the "
     "page `measure` (MEASURE, which loads the page in a frame of that width).")
    dom = subprocess.run([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--allow-file-access-from-files',
                          '--virtual-time-budget=10000', f'--window-size={WIDTH + 20},900', '--dump-dom',
                          f'{measure.as_uri()}#{path.as_uri()}'], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'WIDE (\[.*?\])</pre>', dom, re.DOTALL)
    if not m: return [f'{path.name} in Chromium: its tables could not be measured']
    return [f'{path.name} at {WIDTH} px: a table of {" ".join(w.split())[:100]}' for w in json.loads(html.unescape(m[1]))]

def check_site(browser=False):
    "Every problem of the site, and a line of counts."
    missing = [f'_docs/{f} is missing' for f in MATH_JS if not (site/f).is_file()]
    notebooks = {p.stem for p in (root/'nbs').glob('*.ipynb')}
    pages = sorted(p for p in site.rglob('*.html') if p.stem != '404' and not {'assets', 'search'} & set(p.parts))
    problems, outputs, images = list(missing), 0, 0
    measure = site/'assets'/'measure-tables.html'
    if browser: measure.write_text(MEASURE)
    for p in pages:
        res, n_out, n_img = page_problems(p, p.parent == site and p.stem in notebooks)
        problems += res; outputs += n_out; images += n_img
        if browser: problems += browser_problems(p) + wide_tables(p, measure)
    if browser: measure.unlink()
    n_notebooks = len(notebooks & {p.stem for p in pages if p.parent == site})
    counts = f'{len(pages)} pages ({n_notebooks} notebooks), {outputs} outputs, {images} images'
    return problems, counts

if __name__ == '__main__':
    problems, counts = check_site(browser='--browser' in sys.argv[1:])
    if problems: sys.exit('the built site has problems:\n' + '\n'.join(problems) + f'\n({counts})')
    sys.stdout.write(f'site checked: {counts}\n')
