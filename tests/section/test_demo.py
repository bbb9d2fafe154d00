"""scripts/demo.py reproduces the section's walk-through, checked against the book's printout."""
import re
import sys

import numpy as onp
import pytest

from conftest import REPO, run_bounded

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's

NUMBER = re.compile(r'-?\d+\.\d+(?:e[-+]\d+)?')

# Printed in the text (seed 000) for MXNet's start-up random state on gpu(0), gpu(1).
BOOK_WEIGHT = [[0.01382882, -0.01183044, 0.01417865],
               [-0.00319718, 0.00439528, 0.02562625],
               [-0.00835081, 0.01387452, -0.01035946]]
BOOK_FORWARD = [
    [2.2610241e-06, 2.2046002e-06, -5.4046800e-06, 1.2869973e-06, 5.1373172e-06,
     -3.8298003e-06, 1.4339025e-07, 5.4683437e-06, -2.8279198e-06, -3.9651122e-06],
    [2.0698640e-06, 2.0084669e-06, -5.6382505e-06, 1.0498463e-06, 5.5506434e-06,
     -4.1065477e-06, 6.0830189e-07, 5.4521765e-06, -3.7365030e-06, -4.1891644e-06],
    [2.4629817e-06, 2.6015512e-06, -5.4362617e-06, 1.2938234e-06, 5.6387926e-06,
     -4.1360113e-06, 3.5758956e-07, 5.5125256e-06, -3.1957316e-06, -4.2976335e-06],
    [1.9431664e-06, 2.2600416e-06, -5.2698178e-06, 1.4807433e-06, 5.4830948e-06,
     -3.9678903e-06, 7.5754087e-08, 5.6764366e-06, -3.2530247e-06, -4.0943946e-06]]


@pytest.fixture(scope='module')
def demo_output():
    # A fresh process: the text's numbers come from MXNet's start-up random state.
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'demo.py'), '--cpu'],
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def section(text, start):
    """The numbers printed after the prompt line ``start``, up to the next blank line."""
    body = text.split(start, 1)[1].split('\n\n', 1)[0]
    return body, [float(x) for x in NUMBER.findall(body)]


def test_the_not_initialized_check_fires_on_the_default_context(demo_output):
    assert '\nnot initialized on cpu\n' in demo_output
    assert 'devices = [cpu(1), cpu(2)]' in demo_output


def test_first_layer_weights_are_identical_on_both_devices_and_match_the_book(demo_output):
    body, numbers = section(demo_output, '>>> weight.data(devices[0])[0], weight.data(devices[1])[0]')
    assert 'ctx=cpu(1)' in body and 'ctx=cpu(2)' in body
    first, second = numbers[:9], numbers[9:]
    assert len(numbers) == 18 and first == second
    onp.testing.assert_allclose(first, onp.ravel(BOOK_WEIGHT), rtol=0, atol=5e-9)


def test_forward_of_four_observations_on_two_devices_matches_the_book(demo_output):
    body, numbers = section(demo_output, '>>> net(x_shards[0]), net(x_shards[1])')
    assert body.index('ctx=cpu(1)') < body.index('ctx=cpu(2)')
    assert len(numbers) == 40
    # GPU and CPU convolutions round differently: the book's GPU values agree to ~1e-5.
    onp.testing.assert_allclose(numbers, onp.ravel(BOOK_FORWARD), rtol=1e-4, atol=1e-10)
