"""tools/book_check.py, the check of the book's 10-epoch run: what it reads from its inputs.

(The evaluation itself needs the run's checkpoint, hours to make: its figures are in
docs/results/book-run-check.json, beside the run's own in book-run.json.)
"""
import subprocess
import sys

import pytest

from conftest import REPO, load_tool

book_check = load_tool('book_check')

REPORT = """\tCommand being timed: "python scripts/train.py"
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:24:52
\tMaximum resident set size (kbytes): 3443960
\tExit status: 0
"""


def test_the_peak_is_read_from_the_time_report_in_mib(tmp_path):
    report = tmp_path / 'time.txt'
    report.write_text(REPORT)
    assert book_check.peak_mib(str(report)) == pytest.approx(3443960 / 1024)


@pytest.mark.parametrize('content', [None, 'Exit status: 0\n'])
def test_a_missing_or_foreign_report_is_one_line_and_status_2_before_any_evaluation(
        tmp_path, content):
    report = tmp_path / 'time.txt'
    if content is not None:
        report.write_text(content)
    proc = subprocess.run([sys.executable, str(REPO / 'tools' / 'book_check.py'),
                           '--checkpoint-dir', str(tmp_path), '--time', str(report),
                           '--data-dir', str(tmp_path), '--out', str(tmp_path / 'out.json')],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith('error: ') and proc.stderr.count('\n') == 1, proc.stderr
    assert 'time -v' in proc.stderr
    assert not (tmp_path / 'out.json').exists()


def test_a_folder_without_a_checkpoint_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / 'tools' / 'book_check.py'),
                           '--checkpoint-dir', str(tmp_path), '--data-dir', str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert 'holds no checkpoint' in proc.stderr and proc.stderr.count('\n') == 1
