"""RL Zoo for real: the sb3 page's launcher and yaml files, written out as the page shows them, and the page's commands
run as real processes of `rl_zoo3` (train, then enjoy, for `per_dqn` and `per_sac`); each training run again with the
same `--seed` saves the very same parameters."""
import os, re, shlex, subprocess, sys
from importlib.metadata import version
from pathlib import Path
import pytest
import torch

from execnb.nbio import read_nb
from fastrl_per.integrations.sb3 import PrioritizedDQN, PrioritizedSAC

# the zoo extra, which tools/test.sh installs: a missing one fails here, not skips. Not imported: importing rl_zoo3
# replaces gymnasium's TimeLimit for the whole process, and the other tests' envs with it.
version('rl_zoo3')

ROOT = Path(__file__).parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))


def page_blocks() -> dict:
    "The fenced blocks of the sb3 page's RL Zoo section: the files, by the name on their first line, and the commands."
    text = '\n'.join(c.source for c in read_nb(ROOT / 'nbs/16_sb3.ipynb').cells if c.cell_type == 'markdown')
    section = text[text.index('## In RL Zoo'):]
    blocks = re.findall(r'```(\w+)\n(.*?)```', section, re.S)
    files = {body.splitlines()[0].lstrip('# ').strip(): body for lang, body in blocks if lang in ('python', 'yaml')}
    commands = [line for lang, body in blocks if lang == 'bash' for line in body.splitlines() if line.strip()]
    return dict(files=files, commands=commands)


def run(line:str, cwd:Path) -> str:
    "One of the page's command lines, run with this interpreter in `cwd`; what it printed."
    args = shlex.split(line)
    assert args[0] == 'python', f"the page's command {line!r} does not start with python"
    done = subprocess.run([sys.executable, *args[1:]], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{line} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


def parameters(path:Path, cls) -> dict:
    "Every tensor of the policy RL Zoo saved at `path`."
    return cls.load(path, device='cpu').policy.state_dict()


@pytest.fixture(scope='module')
def zoo(tmp_path_factory):
    "The page's files written to a fresh directory, each of the page's commands run there in order, then each training again."
    d, blocks = tmp_path_factory.mktemp('zoo'), page_blocks()
    for name, body in blocks['files'].items(): (d / name).write_text(body)
    outputs = [(line, run(line, d)) for line in blocks['commands']]
    again = [run(line, d) for line in blocks['commands'] if ' train ' in line]
    return d, outputs, again


def test_the_page_shows_a_launcher_the_yamls_and_both_commands_for_both_algorithms():
    blocks = page_blocks()
    assert set(blocks['files']) == {'per_zoo.py', 'per_dqn.yml', 'per_sac.yml'}
    for algo in ('per_dqn', 'per_sac'):
        assert [c.split()[2] for c in blocks['commands'] if f'--algo {algo}' in c] == ['train', 'enjoy']


@pytest.mark.parametrize('algo, env_id, cls', [('per_dqn', 'CartPole-v1', PrioritizedDQN),
                                                ('per_sac', 'Pendulum-v1', PrioritizedSAC)])
def test_train_then_enjoy_and_one_seed_repeats_the_run(zoo, algo, env_id, cls):
    d, outputs, again = zoo
    first, second = (d / 'logs' / algo / f'{env_id}_{i}' / f'{env_id}.zip' for i in (1, 2))
    assert first.exists() and second.exists(), sorted(p.name for p in (d / 'logs' / algo).iterdir())
    model = cls.load(first, device='cpu')
    assert type(model) is cls and model.replay_buffer_class.__name__ == 'PrioritizedSB3Buffer'
    assert model._n_updates > 0, "RL Zoo's run never trained: the test would compare untrained networks"
    enjoyed = [out for line, out in outputs if f'enjoy --algo {algo}' in line]
    assert enjoyed and 'Mean reward' in enjoyed[0] and f'{algo}/{env_id}_1' in enjoyed[0]
    a, b = parameters(first, cls), parameters(second, cls)
    assert set(a) == set(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"two RL Zoo runs with --seed 0 saved different {differ}"
