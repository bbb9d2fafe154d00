"""The runs of one train command, one per kvstore, and the files they write (--plot, --json...).

Several kvstores are compared one after another on the same data and initial
weights: a line before each run says which it is and, once a run has
finished, when the comparison ends (``progress.Schedule``); the outputs are
written as each run finishes, marked partial until all have; a stop keeps
the finished runs' results, printed and written marked partial (``kept``),
and a stop between two runs begins no other (``StoppedBetweenRuns``).
"""
from . import messages
from ..errors import Interrupted, StoppedBetweenRuns
from ..run.files import write_json
from ..run.progress import Schedule, duration
from ..study.charts import accuracy_chart
from ..study.compare import recommend
from ..study.kvstore_report import comparison_table, runs_json, write_kvstore_report

__all__ = ['Comparison', 'write_outputs', 'partial_note']


def write_outputs(args, results, config, tracker, pending=(), partial=None):
    """Write the ``--plot``, ``--json`` and ``--report`` files, each atomically; return their paths.

    ``pending``: the kvstores compared whose runs have not finished; ``partial``
    says why (the outputs are then marked partial).
    """
    written = []
    if args.plot:
        devices = ', '.join(results[0].devices)
        accuracy_chart(args.plot, results, title=f'{args.model} on {args.dataset}, [{devices}]'
                       + (' (partial)' if partial else ''))
        written.append(args.plot)
    if args.json:
        write_json(args.json, runs_json(results, tracker, config, partial))
        written.append(args.json)
    if args.report:
        write_kvstore_report(args.report, results, tracker, config,
                             recommend(results, pending=pending), partial)
        written.append(args.report.rstrip('/') + '/')
    return written


def partial_note(pending, finished, why=None):
    """Why the outputs of a comparison are partial: ``why`` it stopped, or that it still runs."""
    if why is None:
        why = (f'written when kvstore {finished[-1]} had finished, while the comparison went on '
               '(a later version replaces this one)')
    return f'{why}; not measured: kvstore {", ".join(pending)}'


class Comparison:
    """The runs of ``kvstores``, one after another (one kvstore: a single run).

    ``config`` is what the outputs record of the run (None: this process
    writes none, a worker after the first); ``tracker`` holds each run's
    parameters after every epoch; ``stop`` (a ``StopRequest``, or None) is
    asked between two runs; the lines go to ``out``.
    """

    def __init__(self, args, kvstores, config, tracker, out, stop=None):
        self.args, self.kvstores, self.config = args, kvstores, config
        self.tracker, self.out, self.stop = tracker, out, stop
        self.results = []
        self.schedule = Schedule(kvstores, 'kvstore comparison') if len(kvstores) > 1 else None

    def run(self, train_one, quiet=False):
        """Train with each kvstore (``train_one(kvstore, schedule)``); return the results.

        ``quiet``: no final line per run (a worker after the first). A stop
        raises its ``Interrupted`` with ``comparison`` set to what ``kept``
        returned, where several kvstores were compared.
        """
        try:
            for kvstore in self.kvstores:
                if self.results and self.stop is not None and self.stop():  # at the last's end
                    raise StoppedBetweenRuns(self.args.num_epochs, self.results[-1].kvstore,
                                             self.kvstores[len(self.results):], self.stop.signum)
                self._begin(kvstore)
                result = train_one(kvstore, self.schedule)
                if self.schedule is not None:
                    self.schedule.end()
                if not quiet:
                    print(result.final_line(), file=self.out, flush=True)
                self.results.append(result)
                pending = self.kvstores[len(self.results):]
                if pending and self.config is not None:  # what is measured is kept as it comes
                    write_outputs(self.args, self.results, self.config, self.tracker, pending,
                                  partial_note(pending, self.kvstores[:len(self.results)]))
        except Interrupted as e:
            if self.schedule is not None:
                e.comparison = self.kept()
            raise
        self._end()
        return self.results

    def _begin(self, kvstore):
        """The line before a run of several: which it is, when the comparison ends."""
        if self.schedule is None:
            return
        left = self.schedule.left()
        self.schedule.begin()
        print(f'-- kvstore {kvstore} ({self.schedule.position()}'
              + (f'; the comparison ends in about {duration(left)}' if left is not None else '')
              + ')', file=self.out, flush=True)

    def _end(self):
        """The side-by-side table of several runs; the outputs, complete."""
        if len(self.results) > 1:
            print(comparison_table(self.results, self.tracker), file=self.out)
            print(recommend(self.results), file=self.out)
        if self.config is not None:  # the first worker writes for all
            write_outputs(self.args, self.results, self.config, self.tracker)

    def kept(self):
        """On a stop: print and write what the finished kvstores measured.

        Returns ``(finished, pending, written)``: the kvstores whose runs
        finished, those that did not, and the output paths written (marked partial).
        """
        finished = [r.kvstore for r in self.results]
        pending = self.kvstores[len(self.results):]
        if not self.results or self.config is None:
            return finished, pending, []
        print(comparison_table(self.results, self.tracker), file=self.out)
        print(recommend(self.results, pending=pending), file=self.out, flush=True)
        why = messages.comparison_why(self.stop.signum if self.stop is not None else None,
                                      pending[0])
        return finished, pending, write_outputs(self.args, self.results, self.config,
                                                self.tracker, pending,
                                                partial_note(pending, finished, why))
