"""--enable-pdl's switch (kernels/pdl.py): it takes effect only where the device has PDL, and a CPU
tensor never gets a PDL launch, whatever the switch says (the interpreter has no such launch)."""

import logging

import pytest
import torch

from pagoda.kernels import ops, pdl


@pytest.fixture(autouse=True)
def restore():
    before = pdl.ENABLED
    yield
    pdl.ENABLED = before


def test_configure_leaves_pdl_off_without_a_hopper_gpu(caplog):
    with caplog.at_level(logging.WARNING, logger="pagoda.kernels.ops"):
        ops.configure(pdl=True, device=torch.device("cpu"))
    assert pdl.ENABLED is False
    assert "--enable-pdl needs a GPU of compute capability 9.0" in caplog.text


def test_configure_turns_pdl_off_again():
    pdl.ENABLED = True
    ops.configure(device=torch.device("cpu"))
    assert pdl.ENABLED is False


def test_cpu_tensors_never_launch_with_pdl():
    pdl.ENABLED = True
    x = torch.zeros(2)
    assert pdl.flag(x) is False and pdl.options(x) == {}
