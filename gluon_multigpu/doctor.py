"""Check that this machine can train: Python, NumPy, MXNet and its build, devices, a two-context step.

Prints a dozen lines and, for each problem found, one line saying what to
install or set; ``--json`` prints the same as one JSON object, for a bug
report. MXNet is loaded in a child process (``probe``), so that an MXNet
that cannot load, or aborts while loading, is reported instead of ending
the doctor. Exit status 0 when no problem was found, 1 when one was, 2 for
bad flags.
"""
import contextlib
from importlib.metadata import distributions
import json
import os
import platform
import signal
import subprocess
import sys
import time

from .base import compat, engine, opcache, signals
from .cli import console
from .cli.arguments import OneLineParser
from .errors import GluonMultiGPUError, Interrupted
from .section.devices import _read_number

__all__ = ['collect', 'problems', 'render', 'probe', 'run_probe', 'main', 'start']

#: The features of MXNet's build the doctor reports (``mxnet.runtime.Features``).
FEATURES = ('MKLDNN', 'CUDA', 'CUDNN', 'NCCL', 'DIST_KVSTORE')
#: Seconds the child process may take to load MXNet and run its two-context step.
PROBE_SECONDS = 300
#: Printed by the child before its JSON, so that whatever MXNet prints while loading is skipped.
MARK = 'gluon-multigpu-doctor-probe:'
#: Printed by the child as it begins each part (what follows it), so the doctor can say what
#: it waits for: every ``PROGRESS_SECONDS``, a line.
STAGE = 'gluon-multigpu-doctor-stage:'
PROGRESS_SECONDS = 20


def _op_cache_line(cache):
    """What the probe's MXNet import took from the operator functions' cache (``base.opcache``)."""
    if not cache.get('installed'):
        return f'off ({opcache.ENV}=0, or MXNet loaded before the package)'
    if not cache.get('path'):
        return 'no cache folder (no home folder, nor an absolute XDG_CACHE_HOME)'
    if cache.get('misses'):
        return f"{cache['misses']} operator functions made and kept in {cache['path']}"
    return f"{cache['hits']} operator functions read from {cache['path']}"


def probe(out=None):
    """In a child process: load MXNet as the package does, read its build and devices, and run
    one two-context training step; print ``MARK`` and the findings as JSON (on ``out``, None:
    standard output)."""
    found, began = {'loads': False}, time.perf_counter()
    print(STAGE + 'importing MXNet', file=out, flush=True)
    try:
        engine.configure(2)
        from ._mxnet import mxnet  # pylint: disable=import-outside-toplevel
    except Exception as e:  # pylint: disable=broad-except  (reported, as the doctor's purpose)
        found['error'] = str(e) if isinstance(e, GluonMultiGPUError) else compat.load_advice(e)
        print(MARK + json.dumps(found), file=out, flush=True)
        return
    found.update(loads=True, version=mxnet.__version__, load_seconds=time.perf_counter() - began,
                 compat=compat.report())
    features = mxnet.runtime.Features()
    found['features'] = {name: bool(features.is_enabled(name)) for name in FEATURES}
    found['cuda_version'] = _cuda_runtime_version() if found['features']['CUDA'] else None
    try:
        found['gpus'] = mxnet.context.num_gpus()
    except mxnet.base.MXNetError as e:
        found.update(gpus=0, gpu_error=(str(e).strip().splitlines() or [type(e).__name__])[0])
    print(STAGE + 'training one step on cpu(0) and cpu(1)', file=out, flush=True)
    found['step'] = two_context_step()
    print(STAGE + 'trying a bfloat16 convolution', file=out, flush=True)
    from .features import precision  # pylint: disable=import-outside-toplevel  (MXNet is loaded)
    try:
        found['bfloat16'] = precision.bfloat16_outlook()
    except Exception as e:  # pylint: disable=broad-except  (reported, not a failed MXNet load)
        found['bfloat16'] = {'trains': False, 'cpu': _error_line(e), 'speedup': None}
    print(MARK + json.dumps(found), file=out, flush=True)


def _cuda_runtime_version():
    """CUDA's runtime version as 'major.minor', read from the library MXNet's build loads."""
    import ctypes  # pylint: disable=import-outside-toplevel
    for name in ('libcudart.so', 'libcudart.so.11.0', 'libcudart.so.12'):
        with contextlib.suppress(OSError):  # not this library's name here
            library, version = ctypes.CDLL(name), ctypes.c_int()
            if library.cudaRuntimeGetVersion(ctypes.byref(version)) == 0:
                return f'{version.value // 1000}.{version.value % 1000 // 10}'
    return None


def two_context_step():
    """One step of a small network with BatchNorm on cpu(0) and cpu(1), the section's
    ``train_batch`` (split_and_load, a Trainer on kvstore ``device``): whether both contexts
    hold the same parameters afterwards, changed by the step, and the seconds it took."""
    import numpy as onp  # pylint: disable=import-outside-toplevel
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    from mxnet import gluon, np  # pylint: disable=import-outside-toplevel
    from .section.steps import train_batch  # pylint: disable=import-outside-toplevel
    began = time.perf_counter()
    try:
        devices = [mx.cpu(0), mx.cpu(1)]
        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(16, activation='relu', in_units=20),
                gluon.nn.BatchNorm(in_channels=16), gluon.nn.Dense(10, in_units=16))
        net.initialize(mx.init.Xavier(), ctx=devices)
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                                kvstore='device')
        rng = onp.random.RandomState(0)
        x = np.array(rng.uniform(size=(8, 20)).astype('float32'))
        y = np.array(rng.randint(0, 10, size=8).astype('float32'))
        before = net[0].weight.data(devices[0]).asnumpy()
        train_batch(net, x, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
        mx.npx.waitall()
        first, second = ([p.data(d).asnumpy() for p in net.collect_params().values()]
                         for d in devices)
        checks = {'same_on_both': all(onp.array_equal(a, b) for a, b in zip(first, second)),
                  'changed': not onp.array_equal(before, first[0]),
                  'finite': all(onp.isfinite(a).all() for a in first)}
        return {'ok': all(checks.values()), **checks, 'seconds': time.perf_counter() - began}
    except Exception as e:  # pylint: disable=broad-except  (reported, as the doctor's purpose)
        return {'ok': False, 'error': _error_line(e), 'seconds': time.perf_counter() - began}


def _error_line(e):
    """``e`` in one line: ``Type: its first line`` (at most 200 characters), or ``Type``."""
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    return f'{type(e).__name__}: {text}' if text else type(e).__name__


def run_probe(python=None, timeout=PROBE_SECONDS, environ=None, every=PROGRESS_SECONDS,
              say=console.say_quietly):
    """Run ``probe`` in a child process; its findings, or why there are none.

    While it runs, ``say`` gets a line every ``every`` seconds naming what the
    child is doing (an MXNet import may take minutes, or hang). The child ends
    with this process, however this one ends: killed, or stopped by a signal
    (``Interrupted`` from ``signals.raising``) while it waits.

    Parameters
    ----------
    python : str, optional
        The Python that runs the probe (default: this one).
    timeout : float
        Seconds the probe may take before it is killed and reported as too slow.
    environ : dict, optional
        The child's environment (default: this process's).
    every : float
        Seconds between the lines saying what the probe is doing.
    say : callable
        Takes each such line (default: printed on standard error).
    """
    command = [python or sys.executable, '-c', 'from gluon_multigpu import doctor; doctor.probe()']
    # the probe ends with the doctor, however the doctor ends (an MXNet import that hangs
    # would keep it forever)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=os.environ if environ is None else environ, stdin=subprocess.DEVNULL,
                          preexec_fn=signals.dying_with_parent(signal.SIGKILL)) as child:
        try:
            stdout, stderr = _wait_saying(child, timeout, every, say)
        except subprocess.TimeoutExpired:
            return {'loads': False, 'error': f'loading MXNet and one step took more than '
                    f'{timeout} s: run gluon-multigpu-doctor again on a quieter machine'}
        finally:
            if child.poll() is None:  # timed out, or this process is stopping: not left behind
                child.kill()
    if (line := next((l for l in stdout.splitlines() if l.startswith(MARK)), None)) is not None:
        return json.loads(line[len(MARK):])
    why = (f'was killed by signal {-child.returncode}' if child.returncode < 0 else
           f'ended with status {child.returncode}')
    return {'loads': False, 'error': f'the process {why} while loading MXNet '
                                     f"({(stderr.strip().splitlines() or [''])[-1]}): reinstall "
                                     f'it ({compat.CPU_INSTALL})'}


def _wait_saying(child, timeout, every, say):
    """``child.communicate()`` within ``timeout`` seconds, saying every ``every`` seconds which
    part of the probe (its last ``STAGE`` line) it is in."""
    began = time.monotonic()
    while (left := timeout - (time.monotonic() - began)) > 0:
        try:
            return child.communicate(timeout=min(every, left))
        except subprocess.TimeoutExpired as e:  # e.stdout: all the child wrote so far, as bytes
            text = e.stdout.decode(errors='replace') if isinstance(e.stdout, bytes) else \
                e.stdout or ''
            stages = [line[len(STAGE):] for line in text.splitlines() if line.startswith(STAGE)]
            say(f"doctor: still {stages[-1] if stages else 'starting Python'} "
                f'({time.monotonic() - began:.0f} s of {timeout} s)...')
    raise subprocess.TimeoutExpired(child.args, timeout)


def collect(step=True, python=None):
    """Everything the doctor reports, as a dict; ``problems`` lists one line for each. Loading
    MXNet in the child (``step``) is announced on stderr first: it may take minutes."""
    facts = {
        'package': next((d.version for d in distributions(name='gluon-multigpu')), None),
        'python': {'version': platform.python_version(), 'executable': python or sys.executable},
        'numpy': numpy_facts(),
        # (name, version) of the distribution that provides mxnet (mxnet, mxnet-cu112, ...)
        'mxnet_distribution': next(((name, version) for name, version in (
            ((d.metadata['Name'] or '').lower(), d.version) for d in distributions())
            if name == 'mxnet' or name.startswith(('mxnet-', 'mxnet_'))), None),
        'cores': engine.cores(),
        # /proc/meminfo's, or None (devices' reader)
        'memory': {key: _read_number('/proc/meminfo', field) for key, field in
                   (('total', 'MemTotal'), ('available', 'MemAvailable'))},
        'engine': engine.recommended(cpu_devices=2), 'probe': None}
    if step and not facts['numpy'].get('error'):  # MXNet imports NumPy: no probe without it
        print(f'doctor: importing MXNet and training one step in a child process (up to '
              f'{PROBE_SECONDS} s)...', file=sys.stderr, flush=True)
        facts['probe'] = run_probe(python)
    facts['problems'] = problems(facts)
    return facts


def numpy_facts():
    """NumPy's version and whether it is known, or, for a NumPy that cannot be imported, why
    (``error``: its exception in one line)."""
    facts = {'version': None, 'known': False,
             'known_range': ['.'.join(map(str, v)) for v in compat.KNOWN_NUMPY]}
    try:
        import numpy  # pylint: disable=import-outside-toplevel  (NumPy only: MXNet is the child's)
        facts['version'] = str(numpy.__version__)
    except Exception as e:  # pylint: disable=broad-except  (a broken install: reported)
        return dict(facts, error=_error_line(e))
    with contextlib.suppress(ValueError):  # a version it cannot read: not known
        facts['known'] = compat.numpy_is_known(facts['version'])
    return facts


def problems(facts):
    """One line for each problem in ``facts`` (what ``collect`` found), saying what to do."""
    found = []
    if facts['numpy'].get('error'):
        found.append(f"NumPy cannot be imported ({facts['numpy']['error']}): reinstall it: pip "
                     f'install --force-reinstall {compat.numpy_pin()}')
    elif not facts['numpy']['known']:
        found.append(f"NumPy {facts['numpy']['version']} lies outside the releases gluon-multigpu "
                     f'was run on ({" to ".join(facts["numpy"]["known_range"])}): if training '
                     f'fails, pip install {compat.numpy_pin()}')
    if facts['mxnet_distribution'] is None:
        found.append(f'no MXNet distribution is installed: {compat.MXNET_INSTALL}')
    elif facts['mxnet_distribution'][1] != '1.9.1':
        found.append(f"MXNet {facts['mxnet_distribution'][1]} is installed; gluon-multigpu is made "
                     f'for 1.9.1: {compat.CPU_INSTALL}')
    if (probed := facts.get('probe')) is None:
        return found
    if not probed.get('loads'):
        found.append(probed.get('error', 'MXNet cannot load'))
        return found
    if probed.get('features', {}).get('CUDA') and not probed.get('gpus'):
        found.append("MXNet's CUDA build sees no GPU (" + probed.get('gpu_error', 'none found') +
                     '): install the NVIDIA driver and check nvidia-smi, or use the CPU build: '
                     f'{compat.CPU_INSTALL}')
    if not (step := probed.get('step') or {}).get('ok'):
        why = step.get('error') or ', '.join(what for what, key in (
            ('parameters differ between the contexts', 'same_on_both'),
            ('the step changed no parameter', 'changed'), ('a parameter is not finite', 'finite'))
            if not step.get(key))
        found.append(f'the two-context step failed ({why}): report it with gluon-multigpu-doctor '
                     '--json')
    return found


def render(facts):
    """The report as lines of text."""
    lines = [f"gluon-multigpu {facts['package'] or '(not installed)'}: doctor",
             f"python    {facts['python']['version']} ({facts['python']['executable']})"]
    numpy = facts['numpy']
    known = 'known' if numpy['known'] else 'not among the known'
    lines.append(f"numpy     does not import ({numpy['error']})" if numpy.get('error') else
                 f"numpy     {numpy['version']} ({known}: {' to '.join(numpy['known_range'])})")
    dist = facts['mxnet_distribution']
    probed = facts.get('probe') or {}
    loads = ('loads' if probed.get('loads') else 'does not load') if facts.get('probe') else ''
    seconds = f" in {probed['load_seconds']:.1f} s" if probed.get('load_seconds') else ''
    lines.append(f"mxnet     {dist[1] + ' (' + dist[0] + ')' if dist else 'not installed'}"
                 f"{', ' + loads + seconds if loads else ''}")
    if made := probed.get('compat'):  # what base.compat changed in the probe's MXNet
        restored = made['numpy_names']
        changes = [f'{len(restored)} NumPy names restored' if restored else 'no NumPy name restored',
                   'distutils.version provided' if made['distutils'] else 'distutils as installed',
                   'operator values made plain' if made['plain_values'] else
                   'operator values as given']
        lines += ['compat    ' + ', '.join(changes),
                  'op cache  ' + _op_cache_line(made.get('op_cache') or {})]
    if features := probed.get('features'):
        cuda = features['CUDA'] and probed.get('cuda_version')
        lines.append('build     ' + ', '.join(
            f"{name} {'yes' if features[name] else 'no'}"
            f"{' ' + cuda if name == 'CUDA' and cuda else ''}" for name in FEATURES))
        lines.append(f"devices   {probed.get('gpus', 0)} GPU(s); CPU contexts cpu(0), cpu(1), ...")
    total, available = facts['memory']['total'], facts['memory']['available']
    mem = (f'{total / 2**30:.1f} GiB memory ({available / 2**30:.1f} available)'
           if total and available else 'memory unknown')
    lines.append(f"machine   {facts['cores']} cores, {mem}")
    settings = ', '.join(f'{k}={v}' for k, v in sorted(facts['engine'].items())) or \
        "MXNet's defaults"
    lines.append(f'engine    for 2 CPU contexts: {settings} (a variable already set wins)')
    if step := probed.get('step'):
        lines.append('step      ' + (f"cpu(0) and cpu(1) trained one step (kvstore device) to the "
                                     f"same parameters in {step['seconds']:.2f} s"
                                     if step.get('ok') else 'failed'))
    if bf16 := probed.get('bfloat16'):
        lines.append('bfloat16  ' + _bfloat16_line(bf16))
    return lines + ([f'problem   {line}' for line in facts['problems']] or ['problems  none'])


def _bfloat16_line(bf16):
    """Whether ``--dtype bfloat16`` trains here, why, and how much faster to expect."""
    if not bf16['trains']:
        return f"no ({bf16['cpu']}): --dtype bfloat16 is refused here"
    if not bf16['speedup']:
        return (f"emulated ({bf16['cpu']}): --dtype bfloat16 trains, expect it no faster than "
                'float32')
    return (f"yes ({bf16['cpu']}): --dtype bfloat16 is expected to train " + ', '.join(
        f'{model} about {ratio:.1f}x' for model, ratio in bf16['speedup'].items()) +
        ' as fast as float32')


def build_parser():
    """Return the argument parser of the doctor."""
    p = OneLineParser(prog='gluon-multigpu-doctor', description=__doc__.splitlines()[0])
    p.add_argument('--json', action='store_true', help='print the findings as one JSON object')
    p.add_argument('--no-step', action='store_true',
                   help='do not load MXNet nor run the two-context step (versions and machine only)')
    return p


def main(argv=None):
    """Run the doctor; return 0 (no problem found), 1 (a problem found) or 2 (bad flags)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    facts = collect(step=not args.no_step)
    print(json.dumps(facts, indent=2, sort_keys=True) if args.json else '\n'.join(render(facts)))
    return 1 if facts['problems'] else 0


def start(launcher=None):
    """The program: ``gluon-multigpu-doctor``, ``python -m gluon_multigpu.doctor``, or
    ``scripts/doctor.py`` (``launcher``). It loads no MXNet itself: no engine settings."""
    try:
        with signals.raising():  # Ctrl-C, SIGTERM, SIGHUP: one line, the probe ended with it
            console.start(main, launcher, engine=False)
    except Interrupted as e:
        console.say_quietly(f'doctor: {e}: stopped before its report')
        sys.exit(128 + (e.signum or signal.SIGINT))


if __name__ == '__main__':
    start()

