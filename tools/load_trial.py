"""Run a measuring program on a quiet machine, or with a load that starts part-way through.

    python tools/load_trial.py --load-at 60 -- python scripts/train.py --kvstore local device ...

With ``--load-at SECONDS`` it starts ``--busy`` CPU-bound processes (default:
as many as there are cores) that many seconds after the program, and stops
them when it ends: the load of another job that arrives halfway. Without it,
nothing is added. It prints the program's last ``--tail`` lines of output
(its answer), how long it ran, and the machine's load average before and after;
``--json PATH`` keeps the same. How issue 39's before/after figures were made
(docs/results.md, "Comparisons on a shared machine").
"""
import argparse
import json
import os
import subprocess
import sys
import time


def busy(count):
    """``count`` processes that keep a core busy each until killed."""
    return [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(count)]


def trial(command, load_at=None, count=None, tail=6):
    """Run ``command``; return what it printed last, its status, seconds and the load."""
    count = count or os.cpu_count() or 2
    before = os.getloadavg()[0]
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    burners, lines = [], []
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        while True:
            if load_at is not None and not burners and time.monotonic() - began >= load_at:
                burners = busy(count)
                lines.append(f'[load_trial: {count} busy processes from {load_at:g} s]\n')
            chunk = proc.stdout.readline()
            if chunk:
                lines.append(chunk)
                continue
            if proc.poll() is not None:
                lines.extend(proc.stdout.readlines())
                break
            time.sleep(0.05)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return {'command': command, 'status': proc.returncode, 'seconds': time.monotonic() - began,
            'load_at': load_at, 'busy': count if load_at is not None else 0,
            'load_before': before, 'load_after': os.getloadavg()[0],
            'tail': [l.rstrip('\n') for l in lines[-tail:]]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--load-at', type=float, metavar='SECONDS',
                   help='start the busy processes this many seconds in (default: none)')
    p.add_argument('--busy', type=int, metavar='N', help='busy processes (default: the cores)')
    p.add_argument('--tail', type=int, default=6, metavar='N', help='lines shown (default: 6)')
    p.add_argument('--json', metavar='PATH', help='also write the result as JSON')
    p.add_argument('command', nargs=argparse.REMAINDER, help='-- then the program and its flags')
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        p.error('give the program to run after --')
    result = trial(command, args.load_at, args.busy, args.tail)
    print('\n'.join(result['tail']))
    print(f"[{result['seconds']:.0f} s, status {result['status']}, load average "
          f"{result['load_before']:.1f} before, {result['load_after']:.1f} after"
          + (f", {result['busy']} busy processes from {args.load_at:g} s" if args.load_at
             is not None else ', nothing added') + ']')
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as f:
            json.dump(result, f, indent=1)
    return 0 if result['status'] == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
