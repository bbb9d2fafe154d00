"""The book's 10-epoch run from one commit: cloned, run, resumed, and recorded with its commit.

A maintainer's tool, not part of the package. The run takes hours on two
cores, so it is stopped (a session's end, a kill) and resumed, perhaps on
another day. So that every epoch comes from the same code, the tool clones
this checkout's commit into ``WORK/src`` once and runs ``scripts/train.py``
from that clone, never from the working tree; a later call resumes from
``WORK/ckpt`` with the same clone. Each call is a segment, recorded in
``WORK/segments.json`` (commit, machine, start, end, epochs done, status;
a segment killed with its tool stays "running" and is marked "killed" by
the next call). ``--out`` is the run's ``--json`` plus ``commit`` and
``segments``. The command (the book's, docs/results.md "The book's run"):

    python tools/book_run.py --work /work/bookrun --out docs/results/book-run.json
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402

#: The book's settings (d2l 13.6: two GPUs, batch 512, lr 0.2, 10 epochs) on two CPU contexts.
BOOK = ['--cpu-devices', '2', '--model', 'resnet18', '--batch-size', '512', '--lr', '0.2',
        '--num-epochs', '10']


def fail(message):
    """One line on standard error, exit status 2 (bad input)."""
    print(f'error: {message}', file=sys.stderr)
    raise SystemExit(2)


def git(*args, cwd=None):
    """A git command's standard output, stripped (in ``cwd``, else the checkout); a failure
    is a one-line error."""
    cwd = cwd or ROOT
    proc = subprocess.run(['git', *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode:
        fail(f"git {' '.join(args)} in {cwd}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout.strip()


def clone(work):
    """``WORK/src``: this checkout's commit, cloned once (a clean tree only); its commit."""
    src = os.path.join(work, 'src')
    if not os.path.isdir(src):
        if git('status', '--porcelain', '--untracked-files=no'):
            fail(f'{ROOT} has uncommitted changes; commit them so the run names its code')
        commit = git('rev-parse', 'HEAD')
        os.makedirs(work, exist_ok=True)
        git('clone', '--quiet', '--no-checkout', ROOT, src, cwd=work)
        git('checkout', '--quiet', commit, cwd=src)
    if git('status', '--porcelain', '--untracked-files=no', cwd=src):
        fail(f'{src} was changed; the run must come from its commit (remove {work} to start over)')
    return src, git('rev-parse', 'HEAD', cwd=src)


def load(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def save(path, value):
    with atomic_write(path) as f:
        f.write(json.dumps(value, indent=1) + '\n')


def epochs_done(ckpt):
    """Whole epochs the run's checkpoint folder holds (its manifest's history; 0 before the
    first: the ``--json`` is written only when a run ends)."""
    return len(load(os.path.join(ckpt, 'manifest.json'), {}).get('history') or [])


def run_segment(args, src, commit):
    """Train (resuming) from ``src`` under ``/usr/bin/time -v``; record the segment."""
    seg_path, run_json = os.path.join(args.work, 'segments.json'), os.path.join(args.work, 'run.json')
    ckpt = os.path.join(args.work, 'ckpt')
    segments = load(seg_path, [])
    for seg in segments:
        if seg['status'] == 'running':
            seg['status'] = 'killed'  # its tool did not come back to record its end
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
    segment = dict(stamp(), commit=commit, start=now, epochs_before=epochs_done(ckpt),
                   extra=args.extra, status='running')
    segments.append(segment)
    save(seg_path, segments)
    timed = ['/usr/bin/time', '-v', '-o', os.path.join(args.work, 'time.txt')]  # the peak memory
    command = [*(timed if os.path.exists(timed[0]) else []), sys.executable,
               os.path.join(src, 'scripts', 'train.py'), *BOOK, '--data-dir',
               os.path.abspath(args.data_dir), '--checkpoint-dir', ckpt,
               '--resume', '--json', run_json, *args.extra]
    env = dict(os.environ, PYTHONPATH=src)  # the clone's package, not an installed one
    status = subprocess.call(command, env=env)
    segment.update(end=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                   epochs_after=epochs_done(ckpt), status=f'exit {status}')
    save(seg_path, segments)
    return status, segments


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work', required=True, help='the clone, checkpoints and records')
    parser.add_argument('--data-dir', default=os.path.join(ROOT, '..', 'shared', 'data',
                                                           'fashion-mnist'))
    parser.add_argument('--out', help='where the finished record goes (after the 10th epoch)')
    parser.add_argument('extra', nargs='*', help="after --: more of train.py's options (a trial "
                        'run; the book run has none)')
    args = parser.parse_args(argv)
    args.work = os.path.abspath(args.work)
    src, commit = clone(args.work)
    status, segments = run_segment(args, src, commit)
    result = load(os.path.join(args.work, 'run.json'), {})
    if status == 0 and result.get('complete') and args.out:
        save(args.out, dict(result, commit=commit, segments=segments))
        print(f'book_run: written {args.out} (commit {commit[:12]}, {len(segments)} segment(s))')
    return status


if __name__ == '__main__':
    sys.exit(main())
