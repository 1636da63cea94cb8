"""--enable-pdl's switch (kernels/pdl.py): it takes effect only on a GPU that has PDL, only for
decode-sized launches, and a CPU tensor never gets a PDL launch, whatever the switch says (the
interpreter has no such launch)."""

import logging

import pytest
import torch

from pagoda.kernels import ops, pdl


@pytest.fixture(autouse=True)
def restore():
    before = pdl.ENABLED
    yield
    pdl.ENABLED = before


def test_configure_leaves_pdl_off_on_the_cpu_quietly(caplog):
    pdl.ENABLED = True
    with caplog.at_level(logging.WARNING, logger="pagoda.kernels.ops"):
        ops.configure(pdl=True, device=torch.device("cpu"))
    assert pdl.ENABLED is False
    assert "enable-pdl" not in caplog.text


def test_configure_warns_on_a_gpu_without_pdl(caplog, monkeypatch):
    monkeypatch.setattr(pdl, "supported", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "an Ampere GPU")
    with caplog.at_level(logging.WARNING, logger="pagoda.kernels.ops"):
        ops.configure(pdl=True, device=torch.device("cuda"))
    assert pdl.ENABLED is False
    assert "--enable-pdl needs a GPU of compute capability 9.0 or later (an Ampere GPU)" in caplog.text


def test_configure_turns_pdl_on_and_off_where_supported(monkeypatch):
    monkeypatch.setattr(pdl, "supported", lambda device: True)
    ops.configure(pdl=True, device=torch.device("cuda"))
    assert pdl.ENABLED is True
    ops.configure(pdl=False, device=torch.device("cuda"))
    assert pdl.ENABLED is False


def test_cpu_tensors_never_launch_with_pdl():
    pdl.ENABLED = True
    x = torch.zeros(2)
    assert pdl.flag(x, 1) is False and pdl.options(False) == {}


def test_only_decode_sized_launches_take_pdl(monkeypatch):
    """PDL where it measured a gain (a few rows); a large batch launches as without it."""

    class FakeCuda:
        is_cuda = True

    pdl.ENABLED = True
    assert pdl.flag(FakeCuda(), 1) and pdl.flag(FakeCuda(), pdl.MAX_ROWS)
    assert not pdl.flag(FakeCuda(), pdl.MAX_ROWS + 1) and not pdl.flag(FakeCuda(), 1024)
    assert pdl.options(True) == {"launch_pdl": True}
    pdl.ENABLED = False
    assert not pdl.flag(FakeCuda(), 1)
