"""MXNet's engine settings (``gm.engine``) and the import-light package.

What a process loaded, and what MXNet loaded with, is process state: those
tests run a fresh Python with the engine variables removed from its
environment. What an operator of MXNet actually uses is observed, not
assumed: the OpenMP team a CPU operator runs on (the threads its first
parallel reduction adds, plus its own), and when a thread reads the scratch
copies (with ``MXNET_CPU_TEMP_COPY=0``, an operator that draws scratch space
dies of SIGFPE).
"""
import json
import os
import pathlib
import signal
import sys
import textwrap

import pytest

import gluon_multigpu as gm
from conftest import limited, run_bounded

#: Variables a fresh process must not inherit from this one (conftest configures the engine).
ENGINE_VARS = ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY', 'GLUON_MULTIGPU_ENGINE_ENV',
               'MXNET_ENGINE_TYPE', 'MXNET_OMP_MAX_THREADS')
CORES = gm.engine.cores()

#: Helpers every probe process starts with.
PRELUDE = '''\
import json, os, sys, warnings
import gluon_multigpu  # loads no MXNet; an `import mxnet` after it finds NumPy prepared (compat)

def omp_team(ctx):
    """The threads a CPU operator of MXNet runs on: the OpenMP team of a parallel reduction
    (the threads its first one adds, plus the worker's own)."""
    import mxnet as mx
    x = mx.np.ones((1 << 22,), ctx=ctx)
    (x[:2] + 1).wait_to_read()      # the engine's worker threads exist now
    before = len(os.listdir('/proc/self/task'))
    x.sum().wait_to_read()          # OpenMP-parallel in MXNet 1.9.1 (elementwise ops are not)
    return len(os.listdir('/proc/self/task')) - before + 1

def report(**values):
    print(json.dumps(values))
'''


def fresh_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_VARS}
    env.update(extra)
    return env


def probe(tmp_path, code, env=None, expect_rc=0):
    """Run ``PRELUDE + code`` as a script in a fresh process; return what it ``report``-ed."""
    script = tmp_path / 'probe.py'
    script.write_text(PRELUDE + textwrap.dedent(code))
    proc = run_bounded([sys.executable, str(script)], timeout=120, env=env or fresh_env(),
                       cwd=str(tmp_path))
    assert proc.returncode == expect_rc, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]) if proc.stdout else None


def line_of(tmp_path, marker):
    """The line number of the probe script's line that contains ``marker``."""
    lines = (tmp_path / 'probe.py').read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if marker in line)


# -- the import-light package -------------------------------------------------------------------

def test_importing_the_package_loads_neither_mxnet_nor_matplotlib(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        seen = [gm.engine, gm.errors, gm.recipes, gm.devices, gm.RECIPES, gm.DeviceError,
                gm.engine.recommended(2), dir(gm), gm.section, gm.observe, gm.machinery, gm.features, gm.filesafety, gm.checkpoints, gm.study]
        report(mxnet='mxnet' in sys.modules, matplotlib='matplotlib' in sys.modules,
               loaded=gm.engine.loaded(), settings=gm.engine.settings())
        ''')
    assert got == {'mxnet': False, 'matplotlib': False, 'loaded': False, 'settings': None}


def test_the_scaling_arithmetic_and_its_report_load_no_mxnet(tmp_path):
    # scaling.py says it does not import MXNet; nor does scaling_report (it draws with matplotlib)
    got = probe(tmp_path, '''
        from lab.studies import scaling_model, scaling_report
        scaling_model.learning_rate('linear', 0.1, 512)
        after_scaling = 'mxnet' in sys.modules
        scaling_report.bandwidth_table([])
        report(after_scaling=after_scaling, after_report='mxnet' in sys.modules,
               matplotlib='matplotlib' in sys.modules)
        ''')
    assert got == {'after_scaling': False, 'after_report': False, 'matplotlib': True}


def test_charts_load_matplotlib_only_when_used(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        gm.engine, gm.errors, gm.recipes, gm.files, gm.results, gm.compare
        before = 'matplotlib' in sys.modules
        gm.charts
        report(before=before, after='matplotlib' in sys.modules)
        ''')
    assert got == {'before': False, 'after': True}


@pytest.mark.slow
def test_training_loads_mxnet_but_not_matplotlib(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        devices = gm.cpu_devices(1)
        gm.train, gm.Training, gm.Progress, gm.Checkpointer, gm.StopRequest, gm.simple_cnn()
        gm.load_data, gm.balance, gm.precision, gm.kvstores, gm.compare
        mxnet, before = 'mxnet' in sys.modules, 'matplotlib' in sys.modules
        gm.Animator
        report(mxnet=mxnet, before=before, after='matplotlib' in sys.modules)
        ''')
    assert got == {'mxnet': True, 'before': False, 'after': True}


def test_every_public_name_can_be_imported_and_is_listed():
    listed = dir(gm)
    for name in gm.__all__:
        namespace = {}
        exec(f'from gluon_multigpu import {name}', namespace)  # pylint: disable=exec-used
        assert namespace[name] is getattr(gm, name), name
        assert name in listed, name
    assert {'__version__', 'MODULES', 'NAMES', 'GROUPS'} <= set(listed)
    assert len(set(gm.__all__)) == len(gm.__all__)  # no name defined twice


def test_every_module_of_every_group_is_reachable_by_its_short_name():
    package = pathlib.Path(gm.__file__).parent
    for group in gm.GROUPS:
        for path in (package / group).glob('*.py'):
            if path.stem != '__init__':
                assert gm.MODULES.get(path.stem) == group, path
                assert getattr(gm, path.stem) is sys.modules[f'gluon_multigpu.{group}.{path.stem}']
    for short, names in gm.NAMES.items():
        module = getattr(gm, short)
        for name in names:
            assert getattr(gm, name) is getattr(module, name), name


def test_an_unknown_name_is_an_ordinary_attribute_error():
    with pytest.raises(AttributeError, match="^module 'gluon_multigpu' has no attribute 'trian'$"):
        gm.trian  # pylint: disable=pointless-statement
    assert not hasattr(gm, '__wrapped__')
    with pytest.raises(ImportError, match="cannot import name 'trian'"):
        exec('from gluon_multigpu import trian', {})  # pylint: disable=exec-used


# -- what the settings are ----------------------------------------------------------------------

def test_recommended_divides_the_cores_among_contexts_and_gives_each_thread_one_scratch_copy():
    # CPU contexts: each context's passes are queued from a thread of its own (machinery.pushers),
    # each thread has one scratch copy, and a context runs one operator at a time
    one = {'MXNET_CPU_TEMP_COPY': '1'}
    assert gm.engine.recommended(2, num_cores=8) == {'OMP_NUM_THREADS': '4', **one}
    assert gm.engine.recommended(3, num_cores=2) == {'OMP_NUM_THREADS': '1', **one}
    assert gm.engine.recommended(16, num_cores=8) == {'OMP_NUM_THREADS': '1', **one}
    assert gm.engine.recommended(1, num_cores=2) == {'OMP_NUM_THREADS': '2', **one}
    assert gm.engine.recommended(num_cores=2) == {'MXNET_CPU_TEMP_COPY': '64'}  # count unknown
    assert gm.engine.recommended(0) == {'MXNET_CPU_TEMP_COPY': '64'}  # GPUs: threads untouched
    assert gm.engine.recommended(2, sync_bn=True, num_cores=2) == {'OMP_NUM_THREADS': '1',
                                                                   'MXNET_CPU_TEMP_COPY': '256'}
    assert gm.engine.recommended(4, sync_bn=True)['MXNET_CPU_TEMP_COPY'] == '512'


def test_a_workers_threads_are_its_hosts_cores_shared_among_the_hosts_workers():
    # the launcher says how many workers share the host; the lab, how many cores a host has
    host = {'GLUON_MULTIGPU_HOST_CORES': '8'}
    assert gm.engine.worker_cores(host) == 8
    assert gm.engine.worker_cores(dict(host, GLUON_MULTIGPU_HOST_WORKERS='2')) == 4
    assert gm.engine.worker_cores(dict(host, GLUON_MULTIGPU_HOST_WORKERS='16')) == 1  # at least
    assert gm.engine.worker_cores({'GLUON_MULTIGPU_HOST_WORKERS': '1'}) == gm.engine.cores()
    environ = dict(host, GLUON_MULTIGPU_HOST_WORKERS='2')
    assert gm.engine.configure(cpu_devices=2, environ=environ) == {'OMP_NUM_THREADS': '2',
                                                                   'MXNET_CPU_TEMP_COPY': '1'}
    with pytest.raises(gm.engine.EngineError, match='GLUON_MULTIGPU_HOST_WORKERS'):
        gm.engine.configure(cpu_devices=1, environ={'GLUON_MULTIGPU_HOST_WORKERS': '0'})


def test_the_launcher_tells_each_worker_how_many_workers_share_its_host():
    from gluon_multigpu.multihost import plan as launch
    settings = launch.Settings(num_workers=3, num_servers=1)
    workers = [r for r in launch.plan(settings, ['a', 'b'], ['train']) if r.kind == 'worker']
    # scheduler on a; server on b; workers on a, b, a
    assert [(r.host, r.env['GLUON_MULTIGPU_HOST_WORKERS']) for r in workers] == \
        [('a', '2'), ('b', '1'), ('a', '2')]
    local = launch.plan(launch.Settings(num_workers=2, num_servers=1), ['127.0.0.1'], ['t'])
    assert [r.env['GLUON_MULTIGPU_HOST_WORKERS'] for r in local if r.kind == 'worker'] == \
        ['2', '2']


def test_configure_never_overrides_the_users_variables():
    environ = {'OMP_NUM_THREADS': '3'}
    assert gm.engine.configure(None, environ=environ) == {'MXNET_CPU_TEMP_COPY': '64'}
    assert environ == {'OMP_NUM_THREADS': '3', 'MXNET_CPU_TEMP_COPY': '64'}
    environ = {'MXNET_CPU_TEMP_COPY': '8'}  # fewer than wanted: still the user's
    assert gm.engine.configure(2, environ=environ, sync_bn=True) == {
        'OMP_NUM_THREADS': str(max(1, CORES // 2))}
    assert environ['MXNET_CPU_TEMP_COPY'] == '8'


def test_configure_can_be_turned_off():
    environ = {'GLUON_MULTIGPU_ENGINE_ENV': '0'}
    assert gm.engine.configure(2, environ=environ) == {}
    assert environ == {'GLUON_MULTIGPU_ENGINE_ENV': '0'}


@pytest.mark.parametrize('name, value', [
    ('OMP_NUM_THREADS', 'abc'), ('OMP_NUM_THREADS', '0'), ('OMP_NUM_THREADS', '2\n3'),
    ('MXNET_CPU_TEMP_COPY', '0'), ('MXNET_ENGINE_TYPE', 'Naive'),
    ('MXNET_EXEC_BULK_EXEC_TRAIN', 'abc'), ('GLUON_MULTIGPU_ENGINE_ENV', 'no')])
def test_a_bad_engine_variable_is_an_engine_error_of_one_line(name, value):
    environ = {name: value}
    with pytest.raises(gm.engine.EngineError) as caught:
        gm.engine.configure(2, environ=environ)
    message = str(caught.value)
    assert message.startswith(f'environment variable {name}={value!r} ') and '\n' not in message
    assert 'unset it' in message
    assert environ == {name: value}  # nothing set


def test_sync_bn_on_the_naive_engine_is_refused():
    with pytest.raises(gm.engine.EngineError, match='unset MXNET_ENGINE_TYPE or drop `sync_bn`'):
        gm.engine.configure(2, sync_bn=True, environ={'MXNET_ENGINE_TYPE': 'NaiveEngine'})
    assert gm.engine.configure(1, sync_bn=True, environ={'MXNET_ENGINE_TYPE': 'NaiveEngine'})
    assert gm.engine.configure(2, environ={'MXNET_ENGINE_TYPE': 'NaiveEngine'})


# -- before MXNet loads -------------------------------------------------------------------------

def test_a_second_plan_replaces_only_what_configure_set(tmp_path):
    got = probe(tmp_path, '''
        from gluon_multigpu.base import engine
        steps = [dict(engine.configure(None)), dict(engine.configure(2))]
        os.environ['MXNET_CPU_TEMP_COPY'] = '100'          # the user's, from now on
        steps.append(engine.configure(1))
        first = {k: os.environ.get(k) for k in engine.CHOSEN}
        steps.append(engine.configure(None))               # GPUs: no threads wanted
        second = {k: os.environ.get(k) for k in engine.CHOSEN}
        os.environ['GLUON_MULTIGPU_ENGINE_ENV'] = '0'
        del os.environ['MXNET_CPU_TEMP_COPY']
        engine.configure(4)
        os.environ['GLUON_MULTIGPU_ENGINE_ENV'] = '1'
        engine.configure(1)
        os.environ['GLUON_MULTIGPU_ENGINE_ENV'] = '0'
        engine.configure(1)                                # removes what the last call set
        report(steps=steps, first=first, second=second,
               off={k: os.environ.get(k) for k in engine.CHOSEN}, mxnet='mxnet' in sys.modules)
        ''')
    half, every = str(max(1, CORES // 2)), str(CORES)
    assert got['steps'] == [{'MXNET_CPU_TEMP_COPY': '64'},
                            {'OMP_NUM_THREADS': half, 'MXNET_CPU_TEMP_COPY': '1'},
                            {'OMP_NUM_THREADS': every}, {}]
    assert got['first'] == {'OMP_NUM_THREADS': every, 'MXNET_CPU_TEMP_COPY': '100'}
    assert got['second'] == {'OMP_NUM_THREADS': None, 'MXNET_CPU_TEMP_COPY': '100'}
    # (the second plan for 2 contexts removed the GPU plan's 64 copies; the user's 100 stays)
    assert got['off'] == {'OMP_NUM_THREADS': None, 'MXNET_CPU_TEMP_COPY': None}
    assert got['mxnet'] is False


@pytest.mark.slow
@pytest.mark.skipif(os.path.exists('/dev/nvidiactl'), reason='a machine with GPUs')
def test_try_all_gpus_without_gpus_gives_one_context_every_core(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        devices = gm.try_all_gpus()
        report(devices=[str(d) for d in devices], settings=gm.engine.settings(),
               team=omp_team(devices[0]))
        ''')
    assert got['devices'] == ['cpu(0)']
    assert got['settings'] == {'OMP_NUM_THREADS': str(CORES), 'MXNET_CPU_TEMP_COPY': '1'}
    assert got['team'] == CORES  # MXNet's own default is half the cores


@pytest.mark.slow
@pytest.mark.parametrize('contexts', [1, 2])
def test_cpu_devices_configures_the_engine_before_mxnet_loads(tmp_path, contexts):
    got = probe(tmp_path, f'''
        import gluon_multigpu as gm
        before = 'mxnet' in sys.modules
        devices = gm.cpu_devices({contexts})
        from mxnet import util
        report(before=before, np=util.is_np_array(), settings=gm.engine.settings(),
               env={{k: os.environ.get(k) for k in gm.engine.CHOSEN}}, team=omp_team(devices[0]))
        ''')
    threads = max(1, CORES // contexts)
    wanted = {'OMP_NUM_THREADS': str(threads), 'MXNET_CPU_TEMP_COPY': '1'}  # one a thread
    assert got['before'] is False and got['np'] is True
    assert got['settings'] == wanted and got['env'] == wanted
    assert got['team'] == threads  # what a CPU operator runs on (MXNet's own: half the cores)


@pytest.mark.slow
def test_a_users_omp_num_threads_wins(tmp_path):
    mine = 3 if max(1, CORES // 2) != 3 else 2
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        warnings.simplefilter('error', gm.engine.EngineWarning)
        applied = gm.engine.configure(2)
        devices = gm.cpu_devices(2)
        report(applied=applied, settings=gm.engine.settings(), team=omp_team(devices[0]))
        ''', env=fresh_env(OMP_NUM_THREADS=str(mine)))
    assert got['applied'] == {'MXNET_CPU_TEMP_COPY': '1'}  # the plan's copies, the user's threads
    assert got['settings'] == {'OMP_NUM_THREADS': str(mine), 'MXNET_CPU_TEMP_COPY': '1'}
    assert got['team'] == mine


@pytest.mark.slow
def test_turned_off_mxnet_loads_with_its_own_defaults(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        warnings.simplefilter('error', gm.engine.EngineWarning)
        applied = gm.engine.configure(2)
        devices = gm.cpu_devices(2)
        report(applied=applied, settings=gm.engine.settings())
        ''', env=fresh_env(GLUON_MULTIGPU_ENGINE_ENV='0'))
    assert got == {'applied': {}, 'settings': {'OMP_NUM_THREADS': None,
                                               'MXNET_CPU_TEMP_COPY': None}}


@pytest.mark.slow
def test_a_bad_engine_variable_stops_mxnet_from_loading_with_one_line(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        try:
            gm.simple_cnn()          # the first name that loads MXNet
        except gm.engine.EngineError as e:
            error = str(e)
        first = 'mxnet' in sys.modules
        os.environ['OMP_NUM_THREADS'] = '1'
        gm.simple_cnn()              # the same process loads it once the variable is right
        report(error=error, first=first, settings=gm.engine.settings())
        ''', env=fresh_env(OMP_NUM_THREADS='abc'))
    # MXNet itself would abort the process (status 134)
    assert "OMP_NUM_THREADS='abc'" in got['error'] and 'from 1 to 1024' in got['error']
    assert '\n' not in got['error']
    assert got['first'] is False
    assert got['settings'] == {'OMP_NUM_THREADS': '1', 'MXNET_CPU_TEMP_COPY': None}


# -- once MXNet is loaded -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(CORES < 2, reason="one core: MXNet's own threads are the plan's")
def test_after_mxnet_loaded_with_other_settings_one_warning_says_restart(tmp_path):
    got = probe(tmp_path, '''
        import mxnet                                   # MXNet first, as the book's notebooks do
        import gluon_multigpu as gm
        env = dict(os.environ)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            devices = gm.cpu_devices(1)                # FIRST
            devices = gm.cpu_devices(1)
            applied = gm.engine.configure(1)
            gm.engine.configure(None)                  # OTHER PLAN
        report(warnings=[[w.category.__name__, str(w.message), w.filename, w.lineno]
                         for w in caught if issubclass(w.category, gm.engine.EngineWarning)],
               unchanged=env == dict(os.environ), applied=applied,
               settings=gm.engine.settings())
        ''')
    script = str(tmp_path / 'probe.py')
    (kind, text, filename, lineno), other = got['warnings']
    assert kind == 'EngineWarning' and (filename, lineno) == (script, line_of(tmp_path, 'FIRST'))
    assert other[2:] == [script, line_of(tmp_path, 'OTHER PLAN')]  # the user's line, not ours
    assert text.startswith('MXNet is already loaded (OMP_NUM_THREADS unset), so the engine '
                           'settings for 1 CPU context are not applied: '
                           f'OMP_NUM_THREADS={CORES} (')  # MXNet's own: half the cores
    assert 'restart the kernel (or Python) and call gm.cpu_devices(1) before' in text
    assert 'MXNET_CPU_TEMP_COPY=64' in other[1]  # the GPU plan's copies: more than MXNet's 4
    assert '\n' not in text
    assert got['unchanged'] is True and got['applied'] == {}
    assert got['settings'] == {'OMP_NUM_THREADS': None, 'MXNET_CPU_TEMP_COPY': None}


@pytest.mark.slow
@pytest.mark.skipif(CORES < 2, reason="one core: MXNet's own threads are the plan's")
def test_devices_built_after_mxnet_loaded_train_as_fast_or_warn_once_with_the_cost(tmp_path):
    """The book's ``[mx.cpu(0), mx.cpu(1)]`` with MXNet loaded first gets what the plan wants
    (each context's passes from a thread of its own, MXNet's own 4 copies each, half the
    cores each): nothing to say. One context built so runs on half the cores: ``train`` and
    ``Training`` say once what it costs and the line that avoids it."""
    body = '''
        tr, te = gm.data.synthetic_data('fashion-mnist', 8, num_train=16, num_test=8,
                                        num_devices=len(devices))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            gm.train(gm.simple_cnn(), tr, te, devices, num_epochs=1, hooks=[])   # TRAIN
            gm.Training(gm.simple_cnn(), tr, te, devices, hooks=[]).fit(1)
        report(warnings=[[str(w.message), w.lineno] for w in caught
                         if issubclass(w.category, gm.engine.EngineWarning)])
        '''
    got = probe(tmp_path, '''
        import mxnet as mx
        import gluon_multigpu as gm
        devices = [mx.cpu(0), mx.cpu(1)]''' + body)
    assert got['warnings'] == []
    got = probe(tmp_path, '''
        import mxnet as mx
        import gluon_multigpu as gm
        devices = [mx.cpu(0)]''' + body)
    [(text, lineno)] = got['warnings']
    assert lineno == line_of(tmp_path, 'TRAIN')
    assert f'OMP_NUM_THREADS={CORES}' in text and 'half the images/s (0.53 times' in text
    assert 'call gm.cpu_devices(1) before anything loads MXNet' in text
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        devices = gm.cpu_devices(1)''' + body)
    assert got['warnings'] == []


@pytest.mark.slow
def test_after_mxnet_loaded_with_the_same_settings_nothing_is_said(tmp_path):
    got = probe(tmp_path, '''
        import gluon_multigpu as gm
        warnings.simplefilter('error', gm.engine.EngineWarning)
        gm.engine.configure(None)                      # a GPU plan: 64 scratch copies
        import mxnet                                   # loads MXNet with them
        gm.cpu_devices(2)                              # wants MXNet's 4: fewer are enough
        gm.engine.configure(2)
        report(settings=gm.engine.settings())
        ''')
    assert got['settings']['MXNET_CPU_TEMP_COPY'] == '64'
    # The user's own variables, in place before MXNet loaded, are what they wanted.
    got = probe(tmp_path, '''
        import mxnet
        import gluon_multigpu as gm
        warnings.simplefilter('error', gm.engine.EngineWarning)
        gm.cpu_devices(1)
        gm.cpu_devices(4)
        report(settings=gm.engine.settings())
        ''', env=fresh_env(OMP_NUM_THREADS='1', MXNET_CPU_TEMP_COPY='16'))
    assert got['settings'] == {'OMP_NUM_THREADS': '1', 'MXNET_CPU_TEMP_COPY': '16'}


@pytest.mark.slow
@pytest.mark.parametrize('first, reads', [
    ('pass', False), ('mx.np.ones((2,)).wait_to_read()', False),
    ('npx.relu(a).wait_to_read()', False), ('(a + 1).wait_to_read()', True),
    ('a.sum().wait_to_read()', True), ('mx.random.seed(1)', True)])
def test_mxnet_reads_the_scratch_copies_at_a_threads_first_operator_that_needs_them(
        tmp_path, first, reads):
    """What ``engine`` says of MXNET_CPU_TEMP_COPY: not read by ``import mxnet``; read by the
    first operator of a thread that needs scratch space or random numbers. 0 copies kills the
    operator that draws scratch space (SIGFPE), so: 0, then ``first``, then 4, then ``a + 1``
    dies if and only if ``first`` made the thread read the variable."""
    script = tmp_path / 'scratch.py'
    script.write_text(textwrap.dedent(f'''
        import os
        import gluon_multigpu  # configures nothing; prepares NumPy for MXNet (base.compat)
        import mxnet as mx
        from mxnet import npx
        npx.set_np()
        a = mx.np.ones((8, 8))
        os.environ['MXNET_CPU_TEMP_COPY'] = '0'
        {first}
        os.environ['MXNET_CPU_TEMP_COPY'] = '4'
        (a + 1).wait_to_read()
        print('ran', flush=True)
        '''))
    proc = run_bounded(limited([sys.executable, str(script)], CORE=0), timeout=120,
                       env=fresh_env())
    assert proc.returncode == (-signal.SIGFPE if reads else 0), (first, proc.stderr[-2000:])
    assert proc.stdout.split() == ([] if reads else ['ran'])


@pytest.mark.slow
def test_mxnet_reads_the_scratch_copies_once_per_thread(tmp_path):
    """Once a thread has read MXNET_CPU_TEMP_COPY, a new value reaches only other threads, which
    is why ``configure`` cannot tell whether setting it after MXNet loaded would take effect."""
    script = tmp_path / 'scratch.py'
    script.write_text(textwrap.dedent('''
        import os, threading
        import gluon_multigpu  # configures nothing; prepares NumPy for MXNet (base.compat)
        import mxnet as mx
        from mxnet import npx
        npx.set_np()
        a = mx.np.ones((8, 8))
        (a + 1).wait_to_read()                   # the main thread has read it (unset: 4)
        os.environ['MXNET_CPU_TEMP_COPY'] = '0'
        (a + 1).wait_to_read()
        print('main thread ran', flush=True)
        thread = threading.Thread(target=lambda: (a + 1).wait_to_read())
        thread.start()
        thread.join()
        print('new thread ran', flush=True)
        '''))
    proc = run_bounded(limited([sys.executable, str(script)], CORE=0), timeout=120,
                       env=fresh_env())
    assert proc.returncode == -signal.SIGFPE, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ['main thread ran']



#: A probe's count of the blocks glibc has mapped (``mallinfo2().hblks``) around a 2 MiB
#: ``malloc``: 1 where glibc maps it (its threshold at or below 2 MiB and the heap's top
#: smaller: glibc maps only what the top cannot serve, so the probe loads no MXNet).
MAPS_2MIB = '''
import ctypes
from gluon_multigpu.base import engine

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Mallinfo2, ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]

def maps_2mib():
    before = libc.mallinfo2().hblks
    block = libc.malloc(2 << 20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(block)
    return mapped
'''


@pytest.mark.parametrize('user_setting', [None, 'MALLOC_MMAP_THRESHOLD_'])
def test_freed_blocks_from_sets_glibcs_threshold_unless_the_user_chose_glibcs_own(
        tmp_path, user_setting):
    # From 1 MiB a 2 MiB block is mapped; from the engine's 4 MiB again, not. A MALLOC_*
    # variable the user set (here glibc's own threshold, 8 MiB) keeps glibc's behaviour.
    env = fresh_env(**({user_setting: str(8 << 20)} if user_setting else {}))
    got = probe(tmp_path, MAPS_2MIB + '''
managed = engine.return_freed_memory()
report(managed=managed, from_1mib=(engine.freed_blocks_from(1 << 20), maps_2mib()),
       from_4mib=(engine.freed_blocks_from(4 << 20), maps_2mib()))
''', env=env)
    if user_setting:
        assert got == {'managed': False, 'from_1mib': [False, 0], 'from_4mib': [False, 0]}
    else:
        assert got == {'managed': True, 'from_1mib': [True, 1], 'from_4mib': [True, 0]}


def test_a_network_compiles_with_its_recipes_mmap_threshold(monkeypatch):
    # ResNet-18's recipe hands freed blocks back from 1 MiB (0.97x its peak memory,
    # docs/results.md "Memory"); the small CNN's keeps the engine's 4 MiB (its steps lost 12%).
    asked = []
    monkeypatch.setattr(gm.engine, 'freed_blocks_from', asked.append)
    gm.training.hybridize(gm.resnet18())
    gm.training.hybridize(gm.simple_cnn())
    assert asked == [1 << 20, gm.engine.MMAP_THRESHOLD] and gm.engine.MMAP_THRESHOLD == 4 << 20
