"The docs pages' benchmark commands still run as written: each script they name exists and takes every flag they give it."
import re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / 'docs').glob('*.md')) + [ROOT / 'README.md']
COMMAND = re.compile(r'benchmarks/(\w+\.py)((?:[ \t]+--?[\w-]+(?:[ \t]+[^\s`#|-][^\s`|]*)*)*)')


def commands() -> dict:
    "Each benchmark script the pages name, with the flags they give it and where."
    found = {}
    for page in PAGES:
        for m in COMMAND.finditer(page.read_text()):
            flags = set(re.findall(r'(?<!\S)(--?[a-z][\w-]*)', m.group(2)))
            found.setdefault(m.group(1), {}).setdefault(page.name, set()).update(flags)
    return found


def test_the_pages_name_benchmarks():
    assert {'per_speed.py', 'learning.py', 'scale.py'} <= set(commands())


@pytest.mark.parametrize('script, uses', sorted(commands().items()))
def test_each_named_benchmark_takes_the_flags_its_pages_give(script, uses):
    path = ROOT / 'benchmarks' / script
    assert path.is_file(), f"{sorted(uses)} name benchmarks/{script}, which does not exist"
    usage = subprocess.run([sys.executable, str(path), '--help'], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0, usage.stderr
    for page, flags in uses.items():
        unknown = sorted(f for f in flags if not re.search(rf'(?<![\w-]){re.escape(f)}(?![\w-])', usage.stdout))
        assert not unknown, f"{page} runs benchmarks/{script} with {unknown}, which it does not take"
