from configparser import ConfigParser
import setuptools, shlex, warnings

# An editable install (tools/setup.sh) warns that a folder named like the package may shadow it: here that folder is the
# package itself, so the warning says nothing about this project
warnings.filterwarnings('ignore', message=r'Editable installation\.')

# note: all settings are in settings.ini; edit there, not here
config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords author author_email'.split()
expected = cfg_keys + "lib_name user branch license status min_python audience language".split()
for o in expected: assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o:cfg[o] for o in cfg_keys}

licenses = {'apache2': 'Apache-2.0', 'mit': 'MIT'}  # settings.ini's name -> the SPDX expression the metadata carries
statuses = [ '1 - Planning', '2 - Pre-Alpha', '3 - Alpha',
    '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive' ]
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
if cfg.get('pip_requirements'): requirements += shlex.split(cfg.get('pip_requirements', ''))
min_python = cfg['min_python']
dev_requirements = (cfg.get('dev_requirements') or '').split()
cli_requirements = (cfg.get('cli_requirements') or '').split()  # the [cli] extra: train's progress bar, plot and TensorBoard
video_requirements = (cfg.get('video_requirements') or '').split()  # the [video] extra: an MP4 encoder with its own ffmpeg
atari_requirements = (cfg.get('atari_requirements') or '').split()  # the [atari] extra: ale-py and OpenCV
minatar_requirements = (cfg.get('minatar_requirements') or '').split()  # the [minatar] extra: MinAtar's five games
box2d_requirements = (cfg.get('box2d_requirements') or '').split()  # the [box2d] extra: gymnasium's Box2D envs (LunarLander)
ray_requirements = (cfg.get('ray_requirements') or '').split()  # the [ray] extra: Ape-X actors on Ray
sb3_requirements = (cfg.get('sb3_requirements') or '').split()  # the [sb3] extra: PrioritizedDQN on Stable-Baselines3
zoo_requirements = (cfg.get('zoo_requirements') or '').split()  # the [zoo] extra: RL Zoo, for the sb3 page's launcher
cleanrl_requirements = (cfg.get('cleanrl_requirements') or '').split()  # the [cleanrl] extra: examples/cleanrl_dqn_per.py

package_data = dict()
pkg_data = cfg.get('package_data', None)
if pkg_data:
    package_data[cfg['lib_name']] =  pkg_data.split() # split as multiple files might be listed

setuptools.setup(
    name = cfg['lib_name'],
    license_expression = licenses.get(cfg['license'].lower(), cfg['license']),
    license_files = ['LICENSE'],
    classifiers = [
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: '+o for o in py_versions[py_versions.index(min_python):]],
    url = cfg['git_url'],
    packages = setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data = True,
    install_requires = requirements,
    extras_require={ 'dev': dev_requirements + cli_requirements + atari_requirements + minatar_requirements,
                     'cli': cli_requirements,
                     'video': video_requirements, 'atari': atari_requirements,
                     'box2d': box2d_requirements, 'ray': ray_requirements, 'minatar': minatar_requirements,
                     'sb3': sb3_requirements, 'zoo': zoo_requirements, 'cleanrl': cleanrl_requirements },
    dependency_links = cfg.get('dep_links','').split(),
    python_requires  = '>=' + cfg['min_python'],
    long_description = open('README.md', encoding='utf-8').read(),
    long_description_content_type = 'text/markdown',
    zip_safe = False,
    entry_points = {
        'console_scripts': cfg.get('console_scripts','').split(),
        'nbdev': [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d']
    },
    package_data = package_data,
    **setup_cfg)
