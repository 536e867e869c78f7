"""`diagnose` on real Diffusers code (issue 50, item 3): a tiny random-init DDPM pipeline and a
denoising loop of one's own (fixtures/diagnose/native/diffusers_ddpm.py; a UNet from a config,
nothing downloaded), run on the TorchTPU stand-in, whose device counts each transfer to the host
exactly, and natively with the CPU standing in for the TPU, where every tensor is a CPU tensor and
diagnose must tell the scheduler's host tensors from the device's itself. Both must find the same
reads, as often."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT
from test_diagnose import diagnosed

pytestmark = pytest.mark.slow  # each run imports diffusers (and, natively, torch_xla through it)

PROGRAM = ROOT / "fixtures" / "diagnose" / "native" / "diffusers_ddpm.py"
LINES = PROGRAM.read_text().splitlines()
PIPELINE = next(number for number, text in enumerate(LINES, 1) if "expect: image copy" in text)
LOOP = next(number for number, text in enumerate(LINES, 1) if "expect: reads of device timesteps" in text)
CALLS, STEPS = 2, 3
# What the stand-in's device counts. The pipeline: one image copy per call, nothing of its scheduler,
# whose tables and timesteps stay on the host. The loop, its timesteps on the device: per step
# (3) and in set-up, `bool` of device scalars (`if t > 0`, `prev_t >= 0`, the index check), a
# device scalar indexing a table (`alphas_cumprod[t]`, `timesteps[index + 1]`: torch reads it in
# C++) and the `nonzero` that finds the previous timestep.
EXPECTED = {
    ("sync", PIPELINE, "cpu"): CALLS,
    ("sync", LOOP, "__bool__"): 12,
    ("sync", LOOP, "indexing with a tpu scalar"): 13,
    ("dynamic-shape", LOOP, "nonzero"): 5,
}


def run(*options: str) -> dict:
    result = diagnosed(PROGRAM, *options)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def found(document) -> dict[tuple, int]:
    return {(f["kind"], f["line"], f["op"]): f["count"] for f in document["findings"]}


def test_on_the_stand_in_the_device_counts_each_read():
    # diffusers is in the stand-in's environment: README's test command installs it there.
    document = run("--backend", "standin")
    assert document["backend"] == "standin"
    assert found(document) == EXPECTED
    copy = next(f for f in document["findings"] if f["line"] == PIPELINE)
    assert copy["via"][-1].startswith("diffusers/pipelines/ddpm/pipeline_ddpm.py:")  # its image.cpu()


def test_natively_the_scheduler_host_tensors_are_no_syncs_and_its_device_reads_are_found():
    """Before issue 50: the pipeline's scheduler reading its own host tensors was 26 `bool` reads
    and 10 `nonzero`, the image's `.numpy()` after `.cpu()` a second sync, and the 13 reads of
    a device scalar indexing a table were missed."""
    document = run()
    assert (document["backend"], document["device"]) == ("native", "cpu")
    assert found(document) == EXPECTED
    # Ranked by what removing each saves: the image copy, which the next call's work would overlap,
    # before the scheduler's reads of device scalars.
    first = document["findings"][0]
    assert (first["line"], first["op"]) == (PIPELINE, "cpu")
    assert first["via"][-1].startswith("diffusers/pipelines/ddpm/pipeline_ddpm.py:")
