"""tools/step_profile.py: both profilers' operators sorted into the same groups, per step."""
import pytest

from conftest import load_tool

step_profile = load_tool('step_profile')


@pytest.mark.parametrize('name, group', [
    # MXNet's operators (the converted bfloat16 graph, kvstore device)
    ('_backward_Convolution', 'convolution_backward'), ('Convolution', 'convolution'),
    ('_backward_BatchNorm', 'batchnorm_backward'), ('BatchNorm', 'batchnorm'),
    ('amp_cast', 'casts'), ('_backward_amp_cast', 'casts'), ('Activation', 'relu_sums'),
    ('elemwise_add', 'relu_sums'), ('add_n', 'relu_sums'), ('ElementwiseSum', 'update'),
    ('multi_sgd_update', 'update'), ('CopyCPU2CPU', 'update'), ('Pooling', 'head'),
    ('FullyConnected', 'head'), ('log_softmax', 'head'), ('_split_v2', 'other'),
    # PyTorch's
    ('aten::convolution_backward', 'convolution_backward'),
    ('aten::mkldnn_convolution', 'convolution'), ('aten::native_batch_norm', 'batchnorm'),
    ('aten::native_batch_norm_backward', 'batchnorm_backward'), ('aten::copy_', 'casts'),
    ('aten::_to_copy', 'casts'), ('aten::clamp_min', 'relu_sums'),
    ('aten::threshold_backward', 'relu_sums'), ('aten::add', 'relu_sums'),
    ('aten::add_', 'update'), ('Optimizer.step#SGD.step', 'update'), ('aten::addmm', 'head'),
    ('autograd::engine::evaluate_function: ConvolutionBackward0', 'autograd'),
    ('ConvolutionBackward0', 'autograd'), ('aten::empty', 'other'),
])
def test_each_operator_lands_in_what_it_does(name, group):
    assert step_profile.group_of(name) == group


def test_the_groups_are_per_step_and_keep_their_costliest_operators_first():
    ops = {'Convolution': (40, 400.0), '_backward_Convolution': (40, 1000.0),
           'BatchNorm': (34, 60.0), 'amp_cast': (88, 14.0), '_backward_amp_cast': (86, 16.0)}
    groups = step_profile.grouped(ops, per_step=10)  # 5 steps, 2 contexts
    assert groups['convolution']['ms'] == 40.0 and groups['convolution_backward']['ms'] == 100.0
    assert groups['casts']['ms'] == pytest.approx(3.0)
    assert groups['casts']['ops'] == [('_backward_amp_cast', 8.6, 1.6), ('amp_cast', 8.8, 1.4)]
    assert sum(g['ms'] for g in groups.values()) == pytest.approx(149.0)
