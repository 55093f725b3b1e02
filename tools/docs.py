"""Prepare the documentation pages: run every notebook in nbs/ and write it, outputs included, to _proc/ for
mkdocs. Cells flagged `#| slow` (or `#| eval: false`) are skipped, as `nbdev_test` skips them; `#| hide` cells
and directive lines are dropped; a notebook with `#| default_exp M` gets an API section for `fastrl_per.M`:
signature, parameter comments (docments) and docstring of each public name (those `fastrl_per.all` exports) defined
there, and of every public method and property of a class, inherited ones included (from this package's classes;
`object`, `IterDataPipe` and other outside bases left out); the module's other names follow as one line each.
(nbdev's own `nbdev_docs` needs Quarto.) A cell that raises, does not compile (which execnb's `run_all` lets
through: tools/check_cells.py) or leaves an error output stops the build with its traceback."""
import ast, importlib, inspect, re, sys, typing
from pathlib import Path
from fastcore.docments import docments
from fastcore.xtras import working_directory
from fastcore.parallel import parallel
from execnb.nbio import write_nb, mk_cell
from execnb.shell import CaptureShell
from nbdev.process import NBProcessor
from check_cells import cell_errors

root = Path(__file__).parent.parent
_re_dir = re.compile(r'^\s*#\|')
_re_heading = re.compile(r'^(#+ .*)$', re.MULTILINE)
_re_md_link = re.compile(r'\]\((docs/[^)#]+)\.md([)#])')  # the README's links to docs/*.md, pages of the site
_re_nb_link = re.compile(r'\]\(nbs/([^)#/]+)\.ipynb([)#])')  # the README's links to notebooks, pages of the site

def skipped(cell):
    "Cells `nbdev_test` does not run: markdown, and code flagged `slow` or `eval: false`."
    d = cell.directives_
    return cell.cell_type != 'code' or 'slow' in d or d.get('eval:', [''])[0].lower() == 'false'

class Source(str):
    "An annotation shown as its source text (modules with `from __future__ import annotations` keep them as strings)."
    def __repr__(self): return str(self)

def as_written(annotation): return Source(annotation) if isinstance(annotation, str) else annotation

def fmt_param(p, comment):
    "`p` as written in a signature, with its parameter comment."
    return f'    {p},' + (f'  # {comment}' if comment else '')

def signature_md(name, obj, is_method=False):
    "A python block with `name`'s signature, one parameter per line with its comment when any has one."
    kind = 'class' if inspect.isclass(obj) else 'def'
    try: sig = inspect.signature(obj)
    except ValueError: return f'```python\n{kind} {name}\n```'  # e.g. an exception class keeping its builtin __init__
    comments = docments(obj)
    params = [p.replace(annotation=as_written(p.annotation)) for p in sig.parameters.values()
              if not (is_method and p.name in ('self', 'cls'))]
    no_ret = sig.return_annotation is sig.empty or inspect.isclass(obj)  # a dataclass's `__init__` returns None
    ret = '' if no_ret else f' -> {inspect.formatannotation(as_written(sig.return_annotation))}'
    ret += f'  # {comments["return"]}' if comments.get('return') else ''
    if not any(comments.get(p.name) for p in params):
        return f'```python\n{kind} {name}({", ".join(map(str, params))}){ret}\n```'
    lines = '\n'.join(fmt_param(p, comments.get(p.name)) for p in params)
    return f'```python\n{kind} {name}(\n{lines}\n){ret}\n```'

def doc_md(obj):
    "The docstring of `obj` as a paragraph, if it has one."
    doc = inspect.getdoc(obj)
    return f'\n\n{doc}' if doc else ''

def own_classes(cls):
    "`cls` and the classes of this package it inherits from, nearest first (`object`, `IterDataPipe`, ... left out)."
    return [c for c in cls.__mro__ if c.__module__.split('.')[0] == 'fastrl_per']

def delegate_classes(cls):
    "The buffer classes a pipe shell wraps: those in the annotation of its `__init__`'s `buffer` argument."
    hint = typing.get_type_hints(cls.__init__).get('buffer') if 'buffer' in inspect.signature(cls).parameters else None
    return [c for c in typing.get_args(hint) or [hint] if inspect.isclass(c) and c.__module__.startswith('fastrl_per')]

def member_doc(cls, name):
    """The docstring of `cls.name`; else of the same name in a class it inherits from or in the buffer it delegates
    to; else that name's parameter comment in one of their signatures, or the sentence of a docstring naming it."""
    classes = own_classes(cls) + [b for d in delegate_classes(cls) for b in own_classes(d)]
    for c in classes:
        if name in vars(c) and (doc := inspect.getdoc(getattr(c, name))): return doc
    for c in classes:
        if comment := docments(c).get(name): return comment[0].upper() + comment[1:] + '.'
    for c in reversed(classes):  # the base that introduced the name speaks of it most plainly
        if sentence := next((s for s in re.split(r'(?<=\.) ', inspect.getdoc(c) or '') if f'`{name}`' in s), None):
            return f'See `{c.__name__}`: {sentence}'
    return None

def public_members(cls):
    "(name, member, class defining it) of each public method and property of `cls`, inherited ones included."
    seen, res = set(), []
    for c in own_classes(cls):
        for name, member in vars(c).items():
            if name in seen: continue  # defined nearer: an override
            seen.add(name)
            if is_documented_member(name, member): res.append((name, member, c))
    return res

undocumented = []  # public properties left out for want of a docstring, reported by `build_page`

def member_md(cls, name, member, owner):
    "Docs of a public method or property of `cls` (defined in `owner`), or None for a property without a docstring."
    notes = ['property'] * isinstance(member, property) + [f'from {owner.__name__}'] * (owner is not cls)
    md = f'#### {cls.__name__}.{name}' + (f' *({", ".join(notes)})*' if notes else '')  # one line: inherited or not
    doc = member_doc(cls, name)
    if isinstance(member, property) and not doc:
        undocumented.append(f'{cls.__name__}.{name}')
        return None
    if not isinstance(member, property): md += '\n\n' + signature_md(name, getattr(cls, name), is_method=True)
    return md + (f'\n\n{doc}' if doc else '')

def is_documented_member(name, member):
    "Public methods and properties are documented; plain class attributes and private names are not."
    kinds = (property, classmethod, staticmethod)
    return not name.startswith('_') and (inspect.isfunction(member) or isinstance(member, kinds))

def name_md(name, obj):
    "Docs of one exported name: a constant's value, a function's signature, or a class with its public members."
    if not callable(obj):
        val = repr(obj)
        return f'### {name}\n\n```python\n{name} = {val if len(val) < 300 else val[:300] + " ..."}\n```'
    md = f'### {name}\n\n' + signature_md(name, obj) + doc_md(obj)
    if not inspect.isclass(obj): return md
    bases = ', '.join(f'`{b.__name__}`' for b in obj.__bases__ if b is not object)
    if bases: md += f'\n\nBases: {bases}'
    members = [member_md(obj, *m) for m in public_members(obj)]
    return '\n\n'.join([md] + [m for m in members if m])

def defined_here(mod):
    "Names in `mod.__all__` that `mod` defines itself (not the ones it imports again, as `fastrl_per.all` does)."
    assigned = {t.id for node in ast.parse(inspect.getsource(mod)).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    return [n for n in mod.__all__ if getattr(getattr(mod, n), '__module__', None) == mod.__name__ or n in assigned]

def helpers_md(modname, mod, names):
    "One line for each helper: its name, signature and the first line of its docstring."
    lines = []
    for n in names:
        obj = getattr(mod, n)
        if not callable(obj): lines.append(f'- `{n}`: a constant'); continue
        try: sig = inspect.signature(obj)
        except ValueError: sig = None
        if sig is not None and not inspect.isclass(obj):   # annotations as written, not as quoted strings
            sig = str(sig.replace(parameters=[p.replace(annotation=as_written(p.annotation)) for p in sig.parameters.values()],
                                  return_annotation=as_written(sig.return_annotation)))
        else: sig = ''
        doc = (inspect.getdoc(obj) or '').split('\n')[0]
        lines.append(f'- `{n}{sig}`' + (f': {doc}' if doc else ''))
    return (f'### Helpers\n\nImportable from `fastrl_per.{modname}`, not part of the public API '
            '(`fastrl_per.all`):\n\n' + '\n'.join(lines))

def api_cells(modname):
    "Markdown cells documenting `fastrl_per.<modname>`: each public name (`fastrl_per.all`) whole, then its helpers."
    mod, public = importlib.import_module(f'fastrl_per.{modname}'), set(importlib.import_module('fastrl_per.all').__all__)
    names = defined_here(mod)
    if not names: return []
    shown, helpers = [n for n in names if n in public], [n for n in names if n not in public]
    head = (f'## API\n\nThe public names of `fastrl_per.{modname}`, which `from fastrl_per.all import *` brings.' if shown
            else f'## API\n\n`fastrl_per.{modname}` adds no names to the public API.')
    return ([mk_cell(head, 'markdown')] + [mk_cell(name_md(n, getattr(mod, n)), 'markdown') for n in shown]
            + ([mk_cell(helpers_md(modname, mod, helpers), 'markdown')] if helpers else []))

def page_cells(cells):
    "Cells as the page shows them: without `hide` cells and directive lines; a skipped cell says why it has no output."
    res = []
    for cell in cells:
        if 'hide' in cell.directives_: continue
        if cell.cell_type == 'code':
            flagged = cell.source and skipped(cell)
            cell.source = '\n'.join(l for l in cell.source.splitlines() if not _re_dir.match(l)).strip()
            if not cell.source: continue
            res.append(cell)
            if flagged: res.append(mk_cell('*Not run when the docs are built (nor by `nbdev_test`).*', 'markdown'))
        else:  # mkdocs-jupyter drops code spans from the titles in the navigation and the contents
            cell.source = _re_heading.sub(lambda m: m.group(1).replace('`', ''), cell.source)
            cell.source = _re_nb_link.sub(r'](\1.html\2', _re_md_link.sub(r'](\1.html\2', cell.source))
            res.append(cell)
    return res

def build_page(path, dest):
    "Run the notebook at `path` as `nbdev_test` does and write its page notebook to `dest`."
    undocumented.clear()
    if errors := cell_errors(path):
        sys.stderr.write(f'{path.name} failed: code cells that do not compile:\n' + '\n'.join(errors) + '\n')
        return False
    nb = NBProcessor(path).nb  # parses each cell's directives into `cell.directives_`
    default_exp = next((c.directives_['default_exp'][0] for c in nb.cells if 'default_exp' in c.directives_), None)
    shell = CaptureShell(path)
    try:
        with working_directory(path.parent): shell.run_all(nb, exc_stop=True, preproc=skipped)
    except Exception:
        sys.stderr.write(f'{path.name} failed:\n{shell.prettytb(fname=path)}\n')
        return False
    if errors := [c.idx_ for c in nb.cells if any(o.get('output_type') == 'error' for o in c.get('outputs', []))]:
        sys.stderr.write(f'{path.name} failed: error outputs in cells {errors}\n')
        return False
    nb.cells = page_cells(nb.cells) + (api_cells(default_exp) if default_exp else [])
    for i, cell in enumerate(nb.cells):
        cell.pop('directives_', None); cell.pop('idx_', None)
        cell.setdefault('id', f'page-{i}')  # the cells added here have none
    write_nb(nb, dest/path.name)
    if undocumented:
        sys.stderr.write(f'{path.name}: public properties without a docstring, left out: {", ".join(undocumented)}\n')
    return True

def build_pages(dest=root/'_proc', n_workers=2):
    "Write a page notebook to `dest` for every notebook in nbs/; return whether all of them ran."
    dest.mkdir(exist_ok=True)
    nbs = sorted((root/'nbs').glob('*.ipynb'))
    return all(parallel(build_page, nbs, dest=dest, n_workers=n_workers, threadpool=False, chunksize=1))

if __name__ == '__main__':
    # Workers must find `build_page` in an importable module: IPython's shell replaces `__main__` in each worker.
    sys.path.insert(0, str(Path(__file__).parent))
    import docs
    sys.exit(0 if docs.build_pages() else 1)
