"""The runs of one train command, one per kvstore, and the files they write (--plot, --json...).

Several kvstores take turns epoch after epoch (every other round backwards),
each training exactly as alone, and are judged by their epochs of the same
round (``compare.recommend``; why: docs/design.md, "Comparisons on a shared
machine"). Outputs are written after each round, marked partial until the
last; a stop keeps every epoch measured (``kept``).
"""
from ..observe import stopping as messages  # the lines a run says when it stops
from ..errors import Interrupted
from ..filesafety.files import write_json
from ..filesafety.output import replace_together
from ..observe.progress import Schedule, duration
from ..study.charts import accuracy_chart
from ..study.compare import recommend
from ..study.kvstore_report import comparison_table, runs_json, write_kvstore_report
from ..study.paired import LoadMeter

__all__ = ['Comparison', 'write_outputs']


def write_outputs(config, results, record, tracker, pending=(), partial=None):
    """Write the ``--plot``, ``--json`` and ``--report`` files together; return their paths.

    Each is written atomically, and all are replaced together (``replace_together``): a write
    that fails puts back what the others held, so no two runs' outputs sit side by side.
    ``record`` is what ``--json`` and the report say of the run (``config``'s settings as
    the run resolved them); ``pending``: the kvstores compared with no epoch measured; ``partial``
    says why the outputs are incomplete (they are then marked partial).
    """

    def write():
        if config.plot:
            accuracy_chart(config.plot, results, title=f'{config.model} on {config.dataset}, '
                           f'[{", ".join(results[0].devices)}]' + (' (partial)' if partial else ''))
        if config.json:
            write_json(config.json, runs_json(results, tracker, record, partial))
        if config.report:  # last: its folder is replaced as a whole, or not at all
            write_kvstore_report(config.report, results, tracker, record,
                                 recommend(results, pending=pending), partial)
    replace_together([p for p in (config.plot, config.json) if p], write)  # raises if one fails
    report = config.report and config.report.rstrip('/') + '/'  # a folder
    return [p for p in (config.plot, config.json, report) if p]


class Comparison:
    """The runs of ``kvstores``, taken in turn epoch after epoch (one kvstore: a single run).

    ``config`` is the run's ``RunConfig`` (its kvstores, epochs and outputs), ``record``
    what the outputs record of the run (None: this process writes none, a worker after
    the first); ``tracker`` holds each run's
    parameters after every epoch; ``stop`` (a ``StopRequest``, or None) is
    asked between two epochs; the lines go to ``out``.
    """

    def __init__(self, config, record, tracker, out, stop=None):
        self.config, self.kvstores, self.record = config, list(config.kvstore), record
        self.tracker, self.out, self.stop, self.rounds = tracker, out, stop, config.num_epochs
        self.runs = {}  # kvstore -> its run (``kvstore_run.KvstoreRun``)
        self.loads = {k: {} for k in self.kvstores}  # kvstore -> {epoch: LoadMeter figures}
        self.current = None  # the epoch in progress: 'epoch 2 of kvstore device'
        self.schedule = (Schedule(self.kvstores, 'kvstore comparison', self.rounds)
                         if len(self.kvstores) > 1 else None)

    @property
    def results(self):
        """The ``TrainResult`` of every kvstore with an epoch measured, in the order given."""
        results = (self.runs[k].result for k in self.kvstores if k in self.runs)
        return [r for r in results if r is not None and r.epochs]

    def run(self, start_one, quiet=False):
        """Train with each kvstore; return the results.

        ``start_one(kvstore, schedule)`` builds a kvstore's run, whose
        ``train(epochs)`` trains that many more epochs and returns its
        ``TrainResult``. ``quiet``: no final line per run (a worker after the
        first). A stop raises its ``Interrupted`` with ``comparison`` set to
        what ``kept`` returned, where several kvstores were compared.
        """
        if self.schedule is None:
            self.runs[self.kvstores[0]] = start_one(self.kvstores[0], None)
            self.runs[self.kvstores[0]].train(self.rounds)
            return self.finish(quiet)
        meter = LoadMeter()
        try:
            for epoch in range(1, self.rounds + 1):
                for i, kvstore in enumerate(self.order(epoch)):
                    if self.schedule.index >= 0 and self.stop is not None and self.stop():
                        raise self._stopped_between(epoch, i)
                    self._begin(kvstore, epoch)
                    if kvstore not in self.runs:
                        # Built at its first turn, just before its first epoch: MXNet draws
                        # the initial weights at the first forward pass, from the generator
                        # seeded when the run is built, so nothing may draw in between.
                        self.runs[kvstore] = start_one(kvstore, self.schedule)
                    meter.start()
                    result = self.runs[kvstore].train(1)
                    self.loads[kvstore][epoch] = meter.stop()
                    result.loads = self.loads[kvstore]
                    self.schedule.end()
                    self.current = None
                if epoch < self.rounds and self.record is not None:  # kept as it comes, partial
                    write_outputs(self.config, self.results, self.record, self.tracker, partial=(
                        f'written after round {epoch} of {self.rounds} (epoch {epoch} of every '
                        'kvstore), while the comparison went on (a later version replaces '
                        'this one)'))
        except Interrupted as e:
            e.comparison = self.kept()
            raise
        return self.finish(quiet)

    def finish(self, quiet=False):
        """Once every run trained: each one's final line (``quiet``: none, a worker after the
        first), the table and the answer of several, the outputs; return the results."""
        if not quiet:
            for result in self.results:  # the book's line, naming its kvstore where several ran
                print(result.final_line() + (f' with kvstore {result.kvstore}'
                                             if self.schedule else ''), file=self.out, flush=True)
        if len(self.results) > 1:  # the side-by-side table of several runs and the answer
            print(comparison_table(self.results, self.tracker), file=self.out)
            print(recommend(self.results), file=self.out)
        if self.record is not None:  # the outputs, complete; the first worker writes for all
            write_outputs(self.config, self.results, self.record, self.tracker)
        return self.results

    def order(self, epoch):
        """The kvstores in the order round ``epoch`` takes them: as given, then backwards, and
        so on (ABC, CBA, ABC), so that no kvstore always follows the same one."""
        return self.kvstores if epoch % 2 else self.kvstores[::-1]

    def _stopped_between(self, epoch, index):
        """The stop at the end of an epoch: what was not begun."""
        if index:
            order = self.order(epoch)
            done = f'epoch {epoch} of kvstore {order[index - 1]}'
            left = [f'epoch {epoch} of kvstore {", ".join(order[index:])}']
        else:
            done = f'round {epoch - 1} (epoch {epoch - 1} of every kvstore)'
            left = []
        if epoch < self.rounds or index == 0:
            first = epoch + bool(index)
            more = f's {first}-{self.rounds}' if first < self.rounds else f' {first}'
            left.append(f'epoch{more} of every kvstore')
        return Interrupted.between_runs(epoch - (not index), done, left, self.stop.signum)

    def _begin(self, kvstore, epoch):
        """The line before an epoch of a run: whose it is, when the comparison ends."""
        left = self.schedule.left()
        self.schedule.begin()
        self.current = f'epoch {epoch} of kvstore {kvstore}'
        print(f'-- kvstore {kvstore}, epoch {epoch}/{self.rounds} ({self.schedule.position()}'
              + (f'; the comparison ends in about {duration(left)}' if left is not None else '')
              + ')', file=self.out, flush=True)

    def measured(self):
        """The epochs measured, in words: ``epochs 1-2 of kvstore local; epoch 1 of kvstore device, none``."""
        counts, done = {}, {r.kvstore: len(r.epochs) for r in self.results}
        for k in self.kvstores:
            counts.setdefault(done.get(k, 0), []).append(k)
        return '; '.join((f'epochs 1-{n}' if n > 1 else 'epoch 1' if n else 'no epoch')
                         + f' of kvstore {", ".join(names)}'
                         for n, names in sorted(counts.items(), reverse=True))

    def kept(self):
        """On a stop: print and write what the kvstores measured.

        Returns ``(measured, current, written)``: the epochs measured in words
        (``measured``), the epoch in progress when it stopped (None between
        two), and the output paths written (marked partial).
        """
        results = self.results
        measured = self.measured() if results else None
        pending = [k for k in self.kvstores if k not in {r.kvstore for r in results}]
        if not results or self.record is None:
            return measured, self.current, []
        print(comparison_table(results, self.tracker), file=self.out)
        print(recommend(results, pending=pending), file=self.out, flush=True)
        why = messages.comparison_why(getattr(self.stop, 'signum', None), self.current)
        written = write_outputs(self.config, results, self.record, self.tracker, pending,
                                f'{why}; measured: {measured}')
        return measured, self.current, written
