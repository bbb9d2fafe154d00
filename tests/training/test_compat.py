"""MXNet 1.9.1 on today's NumPy and Python (``gluon_multigpu.base.compat``), and the doctor.

What runs here runs under whichever NumPy and Python the suite was installed on:
``tools/runtimes.py`` runs this file (one of its ``CHECKS``) under NumPy 1.23,
1.26 and 2.x and under Python 3.12 and 3.13, where the real removals are met. The
removals themselves are also faked here (a NumPy module without the names, a
Python without ``distutils``, an MXNet whose library needs a missing one), so
that each path is checked on any runtime.
"""
import importlib
import json
import os
import pathlib
import re
import sys
import textwrap
import types
import warnings

import numpy as onp
import pytest

from gluon_multigpu.base import compat
from gluon_multigpu import doctor
from conftest import REPO, run_bounded


def numpy_without(*names):
    """A module holding real NumPy's attributes but ``names`` (as a NumPy that removed them)."""
    fake = types.ModuleType('numpy')
    fake.__dict__.update({k: v for k, v in vars(onp).items()
                          if k not in names and k != '__getattr__'})
    return fake


#: Names some NumPy removed. ``trapz``'s replacement, ``trapezoid``, came with NumPy 2.0: before
#: it, a NumPy without ``trapz`` cannot be (and never was) made.
REMOVED = ('bool', 'int', 'float', 'object', 'PZERO', 'NINF', 'NAN', 'float_', 'unicode_',
           'in1d', 'msort', 'product', 'alltrue', 'mirr', 'npv') + \
    (('trapz',) if hasattr(onp, 'trapezoid') else ())


def test_each_removed_name_is_restored_and_nothing_present_is_replaced():
    fake = numpy_without(*REMOVED)
    kept = {k: v for k, v in vars(fake).items()}
    restored = compat.restore_numpy_names(fake)
    assert set(REMOVED) <= set(restored)
    for name, value in kept.items():
        assert vars(fake)[name] is value, name  # nothing that was there changed
    assert fake.bool is bool and fake.int is int and fake.object is object
    assert fake.PZERO == 0.0 and fake.NINF == -onp.inf and onp.isnan(fake.NAN)
    assert fake.float_ is onp.float64 and fake.unicode_ is onp.str_
    assert compat.restore_numpy_names(fake) == []  # a second call changes nothing


def test_the_modules_text_lists_every_name_it_may_restore():
    # the module's docstring (its notes), which help() shows in an installed package
    words = set(re.findall(r'[A-Za-z_][A-Za-z_0-9]*', compat.__doc__))
    assert set(compat._replacements(onp)) <= words  # pylint: disable=protected-access


def test_a_name_numpy_still_gives_with_a_warning_is_left_as_it_is():
    fake = numpy_without('bool')
    served = object()

    def deprecated(name):
        if name == 'bool':
            warnings.warn('np.bool is deprecated', DeprecationWarning)
            return served
        raise AttributeError(name)
    fake.__getattr__ = deprecated
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the check itself must not warn
        restored = compat.restore_numpy_names(fake)
    assert 'bool' not in restored and 'bool' not in vars(fake)


def test_the_restored_functions_compute_what_numpy_did():
    fake = numpy_without(*REMOVED)
    compat.restore_numpy_names(fake)
    a = onp.array([[3, 1], [2, 5], [1, 0]])
    assert onp.array_equal(fake.msort(a), onp.sort(a, axis=0))
    assert onp.array_equal(fake.in1d([[1, 2], [3, 4]], [2, 4]), [False, True, False, True])
    assert fake.product([2, 3, 4]) == 24 and fake.alltrue([1, 1]) and not fake.alltrue([1, 0])
    if 'trapz' in REMOVED:
        assert fake.trapz([1.0, 2.0, 3.0]) == pytest.approx(4.0)
    assert fake.asfarray([1, 2]).dtype == onp.float64
    with pytest.raises(NotImplementedError, match='numpy-financial'):
        fake.mirr([1.0], 0.1, 0.1)


def test_this_processes_numpy_has_every_name_mxnet_reads():
    import gluon_multigpu._mxnet  # noqa: F401  (loads MXNet through compat)
    for name in ('bool', 'int', 'float', 'object', 'PZERO', 'NZERO', 'NINF', 'NAN', 'Inf',
                 'float_', 'msort', 'in1d', 'trapz', 'mirr', 'npv', 'pmt'):
        assert compat._has(onp, name), name  # pylint: disable=protected-access


def test_mxnet_imported_directly_after_the_package_is_prepared_too():
    # A user's script or notebook cell: `import gluon_multigpu`, then `import mxnet` itself.
    script = textwrap.dedent('''
        import json, numpy as onp
        import gluon_multigpu
        from gluon_multigpu.base import compat
        import mxnet as mx
        mx.npx.set_np()
        shards = mx.np.split(mx.np.arange(6), [onp.int64(2)])
        print(json.dumps([compat.report(), shards[1].asnumpy().tolist(),
                          [type(f).__name__ for f in __import__('sys').meta_path]]))
    ''')
    proc = run_bounded([sys.executable, '-c', script], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report, shard, finders = json.loads(proc.stdout.splitlines()[-1])
    assert report['prepared'] and shard == [2.0, 3.0, 4.0, 5.0]
    assert report['plain_values'] == (compat.numpy_version() >= (2, 0))
    assert 'OnLoad' not in finders  # the finders took themselves off


#: The public line that makes a plain ``import mxnet`` work on NumPy 2 and Python 3.12+ (README,
#: docs/guide.md "Python and NumPy"), as examples/plain_mxnet.py writes it.
ONE_LINE = 'import gluon_multigpu  # noqa: F401  (the one line: before `import mxnet`)'


def test_mxnets_own_gluon_examples_run_after_the_one_line():
    # A user of MXNet alone: a Trainer step, kvstores local and device, split_and_load over two
    # contexts, each checked against its arithmetic done by hand (in the example itself).
    example = REPO / 'examples' / 'plain_mxnet.py'
    source = example.read_text()
    assert source.index(ONE_LINE + '\n') < source.index('\nimport mxnet as mx\n')
    proc = run_bounded([sys.executable, str(example)], timeout=120, cwd=REPO / 'examples')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        'trainer step: ok (loss 4.5, weight [0.7, 0.4])',
        'kvstore local: ok (pushed 1 and 2 from 2 contexts, pulled 3)',
        'kvstore device: ok (pushed 1 and 2 from 2 contexts, pulled 3)',
        'split_and_load: ok (2 parts; both contexts at [-1.5, -2.0])'], proc.stdout
    if compat.numpy_version() >= (2, 0):  # the line is what makes it work: without it, no MXNet
        without = run_bounded([sys.executable, '-c', source.replace(ONE_LINE, 'pass')],
                              timeout=120, cwd=REPO / 'examples')
        assert without.returncode == 1 and 'NumPy 2.0' in without.stderr, without.stderr[-2000:]


def test_a_broken_mxnet_imported_directly_says_what_to_install(tmp_path):
    env = fake_mxnet(tmp_path, "raise OSError('libgomp.so.1: cannot open shared object file')")
    proc = run_bounded([sys.executable, '-c', 'import gluon_multigpu, mxnet'], timeout=60, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith('gluon_multigpu.errors.MXNetLoadError')
    assert 'apt-get install libgomp1' in proc.stderr


#: How an MXNet install is broken -> its import's body and what the one line must say.
BROKEN = {
    'a library it needs missing': ("raise OSError('libquadmath.so.0: cannot open shared object "
                                   "file')", 'libquadmath0'),
    # a half-copied install: MXNet's libinfo finds no libmxnet.so
    'its own library missing': ("raise RuntimeError('Cannot find the MXNet library.')",
                                'pip install --force-reinstall --no-deps mxnet==1.9.1'),
}


@pytest.mark.parametrize('program, broken', [
    *[(p, 'a library it needs missing') for p in ('train.py', 'demo.py', 'balance.py')],
    *[(p, 'its own library missing') for p in ('train.py', 'demo.py', 'balance.py', 'scaling.py',
                                               'bandwidth.py', 'bfloat16.py', 'inflight.py')]])
def test_a_program_on_a_broken_mxnet_is_one_line_and_status_2(tmp_path, program, broken):
    body, words = BROKEN[broken]
    env = fake_mxnet(tmp_path, body)
    argv = {'train.py': ['--cpu-devices', '2', '--num-epochs', '1']}.get(program, [])
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / program)] + argv, timeout=120,
                       env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
    assert 'MXNet cannot load' in proc.stderr and 'Traceback' not in proc.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / 'mxnet']  # nothing written


#: How a NumPy install is broken -> its import's body (as a NumPy built for another Python, or
#: a checkout of NumPy's source, fails).
BROKEN_NUMPY = {
    'its C extensions missing': "raise ImportError('\\n\\nIMPORTANT: PLEASE READ THIS FOR ADVICE "
                                "ON HOW TO SOLVE THIS ISSUE!\\n\\nImporting the numpy "
                                "C-extensions failed.')",
    'built for another ABI': "raise RuntimeError('module compiled against ABI version 0x1000009')",
}


@pytest.mark.parametrize('broken', sorted(BROKEN_NUMPY))
@pytest.mark.parametrize('program', ['scripts/train.py', 'scripts/demo.py',
                                     'gluon-multigpu-train'])
def test_a_program_on_a_broken_numpy_is_one_line_and_status_2(tmp_path, program, broken):
    env = fake_mxnet(tmp_path, '')  # the folder first on the path; its mxnet is not reached
    (tmp_path / 'numpy').mkdir()
    (tmp_path / 'numpy' / '__init__.py').write_text(BROKEN_NUMPY[broken])
    start = [str(pathlib.Path(sys.executable).parent / program)] if program.startswith('gluon') \
        else [sys.executable, str(REPO / program)]
    argv = ['--cpu-devices', '2', '--num-epochs', '1'] if 'train' in program else []
    proc = run_bounded(start + argv, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert 'NumPy cannot be imported' in proc.stderr and "pip install --force-reinstall 'numpy>=" \
        in proc.stderr and 'Traceback' not in proc.stdout
    assert ('IMPORTANT: PLEASE READ' if 'C ext' in broken else 'ABI version') in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mxnet', 'numpy']  # nothing written


def test_failing_package_names_the_package_whose_import_failed_and_nothing_else(tmp_path,
                                                                                monkeypatch):
    (tmp_path / 'halfcopied').mkdir()
    (tmp_path / 'halfcopied' / '__init__.py').write_text("raise RuntimeError('no library')")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError) as broken:
        importlib.import_module('halfcopied')
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module('halfcopied_not_there.sub')
    with pytest.raises(json.JSONDecodeError) as at_run_time:  # a loaded module's error
        json.loads('{')
    assert compat.failing_package(broken.value) == 'halfcopied'
    assert compat.failing_package(missing.value) == 'halfcopied_not_there'
    assert compat.failing_package(at_run_time.value) is None
    assert compat.load_advice(broken.value) == ('halfcopied cannot be imported (RuntimeError: no '
                                                'library): reinstall the package that provides it')


def test_the_launcher_on_a_broken_mxnet_says_it_in_one_line_and_ends_with_status_2(tmp_path):
    # The scheduler and the server load MXNet in their own processes (plan.ROLE): each says the
    # line (the server's, if it got that far before the launcher stopped the job; on a loaded
    # machine it can come first). The worker waits (as one joining them would): the launcher
    # stops it.
    env = fake_mxnet(tmp_path, BROKEN['its own library missing'][0])
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'launch.py'), '-n', '1', '--',
                        sys.executable, '-c', 'import time; time.sleep(300)'], timeout=120,
                       env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith('[scheduler@') for line in lines) and len(lines) <= 2, proc.stdout
    for line in lines:
        assert re.fullmatch(r'\[(scheduler|server 0)@\S+\] error: MXNet cannot load \(RuntimeError: '
                            r'Cannot find the MXNet library\.\): reinstall it .*', line), line
    assert re.fullmatch(r'launch: scheduler@\S+ failed \(status 2\); stopping the job',
                        proc.stderr.strip()), proc.stderr


def test_the_doctor_and_the_package_name_the_same_cure_for_an_mxnet_without_its_library(tmp_path):
    env = fake_mxnet(tmp_path, BROKEN['its own library missing'][0])
    proc = run_bounded([sys.executable, '-c', 'import gluon_multigpu, mxnet'], timeout=60, env=env)
    assert proc.stderr.strip().splitlines()[-1].startswith('gluon_multigpu.errors.MXNetLoadError')
    line = proc.stderr.strip().splitlines()[-1].split(': ', 1)[1]
    doctor = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor'], timeout=120, env=env)
    assert f'problem   {line}' in doctor.stdout.splitlines(), doctor.stdout


def test_version_classes_compare_as_mxnets_checks_need():
    lv, sv = compat.LooseVersion, compat.StrictVersion
    assert lv('2.4.6') >= lv('1.17') and lv('1.16.6') < lv('1.17') and lv('1.17') == lv('1.17.0')
    assert sv('1.26.4') >= sv('1.6.0') and not sv('1.5.9') >= sv('1.6.0')
    assert lv('2.0.0rc1') >= lv('1.15') and lv('1.23.5') >= '1.15'
    with pytest.raises(ValueError):
        sv('not a version')


def test_without_distutils_mxnet_loads_and_trains_two_contexts(tmp_path):
    # As on Python 3.12 and newer without setuptools: `import distutils` fails.
    script = textwrap.dedent('''
        import sys
        sys.modules['distutils'] = None      # import distutils now raises ImportError
        import gluon_multigpu as gm
        devices = gm.cpu_devices(2)
        from gluon_multigpu.base import compat
        train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 32, num_train=64,
                                                      num_test=32)
        result = gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1)
        from distutils.version import LooseVersion
        print(compat.report()['distutils'], LooseVersion('1.17') < LooseVersion('2.0'),
              result.epochs[-1].train_loss > 0)
    ''')
    proc = run_bounded([sys.executable, '-c', script], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-3:] == ['True', 'True', 'True'], proc.stdout


def test_plain_makes_numpy_scalars_python_numbers_inside_lists_and_tuples():
    value = compat.plain([0, onp.int64(4), (onp.float32(0.5), [onp.bool_(True)])], onp.generic)
    assert value == [0, 4, (0.5, [True])]
    assert type(value[1]) is int and type(value[2][0]) is float and type(value[2][1][0]) is bool
    assert 'np.' not in str(value)
    unchanged = [1, 'a', 2.5]
    assert compat.plain(unchanged, onp.generic) is unchanged  # nothing to do: the same object


def test_a_wrapped_invoke_is_handed_plain_values():
    seen = []

    def invoke(handle, ndargs, keys, vals, out):
        seen.append([str(v) for v in vals])
        return handle
    wrapped = compat._plain_values(invoke, onp.generic, 3)  # pylint: disable=protected-access
    assert wrapped(7, [], ['indices', 'axis'], [[0, onp.int64(4)], onp.int32(0)], None) == 7
    assert seen == [['[0, 4]', '0']]
    vals = ['[0, 4]', 1]
    assert wrapped(8, [], ['a', 'b'], vals, None) == 8 and seen[-1] == ['[0, 4]', '1']


def test_split_at_numpy_integers_gives_numpys_shards():
    from gluon_multigpu._mxnet import mxnet as mx
    x = onp.arange(14, dtype='float32').reshape(7, 2)
    shards = mx.np.split(mx.np.array(x), [onp.int64(3), onp.int64(5)], axis=0)
    expected = onp.split(x, [3, 5])
    assert [s.asnumpy().tolist() for s in shards] == [e.tolist() for e in expected]
    # The wrapping is there on NumPy 2 (where the repr changed) and only there.
    assert compat.report()['plain_values'] == (compat.numpy_version() >= (2, 0))


def test_a_training_leaves_numpys_print_options_and_error_settings_as_they_were():
    script = textwrap.dedent('''
        import json, numpy
        before = (numpy.get_printoptions(), numpy.geterr(), numpy.array([0.1]).dtype.name)
        import gluon_multigpu as gm
        devices = gm.cpu_devices(2)
        train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 32, num_train=64,
                                                      num_test=32)
        gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1)
        after = (numpy.get_printoptions(), numpy.geterr(), numpy.array([0.1]).dtype.name)
        print(json.dumps([repr(before), repr(after)]))
    ''')
    proc = run_bounded([sys.executable, '-c', script], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = json.loads(proc.stdout.splitlines()[-1])
    assert before == after


@pytest.mark.parametrize('error, advice', [
    (OSError('libquadmath.so.0: cannot open shared object file: No such file or directory'),
     'apt-get install libquadmath0'),
    (OSError('libgomp.so.1: cannot open shared object file: No such file or directory'),
     'apt-get install libgomp1'),
    (OSError('libcuda.so.1: cannot open shared object file: No such file or directory'),
     'no NVIDIA driver is installed'),
    (ModuleNotFoundError("No module named 'mxnet'", name='mxnet'), 'pip install mxnet==1.9.1'),
    (AttributeError("module 'numpy' has no attribute 'FOO'"), "pip install 'numpy>=1.17,<"),
])
def test_an_mxnet_that_cannot_load_gets_one_line_saying_what_to_install(error, advice):
    line = compat.load_advice(error)
    assert advice in line and '\n' not in line


def fake_mxnet(folder, body):
    """A module ``mxnet`` in ``folder`` whose import does ``body`` (as a broken install would)."""
    package = folder / 'mxnet'
    package.mkdir()
    (package / '__init__.py').write_text(body)
    return {**os.environ, 'PYTHONPATH': os.pathsep.join(
        [str(folder), str(REPO)] + os.environ.get('PYTHONPATH', '').split(os.pathsep))}


@pytest.mark.parametrize('body, words', [
    ("raise OSError('libquadmath.so.0: cannot open shared object file: No such file or "
     "directory')", 'libquadmath0'),
    ("raise OSError('libgomp.so.1: cannot open shared object file')", 'libgomp1'),
    ("raise OSError('libcuda.so.1: cannot open shared object file')", 'NVIDIA driver'),
    ("import os; os.abort()", 'killed by signal 6'),
])
def test_the_doctor_names_what_to_install_for_an_mxnet_that_cannot_load(tmp_path, body, words):
    env = fake_mxnet(tmp_path, body)
    proc = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor'], timeout=120, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    problems = [line for line in proc.stdout.splitlines() if line.startswith('problem')]
    assert len(problems) == 1 and words in problems[0], proc.stdout
    assert 'Traceback' not in proc.stdout + proc.stderr


def test_the_doctor_says_when_numpy_is_newer_than_the_releases_it_knows(monkeypatch):
    monkeypatch.setattr(onp, '__version__', '3.1.0')
    facts = doctor.collect(step=False)
    assert facts['numpy']['version'] == '3.1.0' and not facts['numpy']['known']
    assert len(facts['problems']) == 1 and 'NumPy 3.1.0' in facts['problems'][0]
    assert "pip install 'numpy>=1.17,<" in facts['problems'][0]
    monkeypatch.setattr(onp, '__version__', '1.26.4')
    assert doctor.collect(step=False)['problems'] == []


def test_the_doctor_reports_this_machine_and_a_two_context_step():
    proc = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor', '--json'], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads(proc.stdout)
    assert facts['problems'] == []
    assert facts['numpy']['version'] == onp.__version__
    assert facts['python']['version'] == '.'.join(map(str, sys.version_info[:3]))
    probed = facts['probe']
    assert probed['loads'] and probed['version'] == '1.9.1'
    assert set(probed['features']) == set(doctor.FEATURES) and probed['features']['MKLDNN']
    step = probed['step']
    assert step['ok'] and step['same_on_both'] and step['changed'] and step['finite']
    # oneDNN 2.4 has bfloat16 kernels wherever the CPU has AVX-512 (emulated without AVX512_BF16)
    flags = next((l.partition(':')[2].split() for l in open('/proc/cpuinfo')
                  if l.startswith('flags')), [])
    assert probed['bfloat16']['trains'] == ('avx512f' in flags), probed['bfloat16']
    assert bool(probed['bfloat16']['speedup']) == bool({'avx512_bf16', 'amx_bf16'} & set(flags))
    text = run_bounded([sys.executable, str(REPO / 'scripts' / 'doctor.py')], timeout=300)
    assert text.returncode == 0 and 8 <= len(text.stdout.splitlines()) <= 14, text.stdout
    said = [l for l in text.stdout.splitlines() if l.startswith('bfloat16  ')]
    assert len(said) == 1 and said[0].startswith('bfloat16  yes' if probed['bfloat16']['speedup']
                                                 else 'bfloat16  no' if 'avx512f' not in flags
                                                 else 'bfloat16  emulated'), said
    assert text.stdout.splitlines()[-1] == 'problems  none'


def test_the_doctor_refuses_a_bad_flag_in_one_line():
    proc = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor', '--jsn'], timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_gpu_install_is_written_one_way_everywhere():
    """README, guide, setup.cfg and every message that suggests MXNet's GPU build give the same
    line (compat.GPU_INSTALL): an install command naming cu112 is that line, whole."""
    import pathlib
    from gluon_multigpu.base.compat import GPU_INSTALL
    repo = pathlib.Path(__file__).resolve().parents[2]
    files = [repo / 'README.md', repo / 'docs' / 'guide.md', repo / 'setup.cfg',
             *sorted((repo / 'gluon_multigpu').rglob('*.py'))]
    found = 0
    for path in files:
        for line in path.read_text(encoding='utf-8').splitlines():
            if 'pip install' in line and 'cu112' in line:
                found += 1
                assert GPU_INSTALL in line or 'GPU_INSTALL = ' in line, (path.name, line)
    assert found >= 4  # README, guide, setup.cfg, the definition
    for name in ('kvstores', 'kvstore_run'):  # the messages take it from there
        assert 'GPU_INSTALL' in (repo / 'gluon_multigpu').joinpath(
            'section' if name == 'kvstores' else 'runs', f'{name}.py').read_text(encoding='utf-8')
