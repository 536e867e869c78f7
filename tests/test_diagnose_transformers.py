"""`diagnose` on real Hugging Face Transformers code (issue 27): `generate` on a tiny random-init
Llama built from a config (nothing downloaded), eager, with the model's forward compiled, with a
static cache, and through a text-generation pipeline, prompts whose lengths repeat and differ
(fixtures/diagnose/native/transformers_generate.py)."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT
from test_diagnose import diagnose

pytestmark = pytest.mark.slow  # each run imports transformers and generates; compiled, it compiles

PROGRAM = ROOT / "fixtures" / "diagnose" / "native" / "transformers_generate.py"
LINES = PROGRAM.read_text().splitlines()
GENERATE_LINE = next(number for number, text in enumerate(LINES, 1) if "model.generate(" in text)
PIPELINE_LINE = next(number for number, text in enumerate(LINES, 1) if "expect: pipeline call" in text)
CALLS, NEW_TOKENS = 3, 6  # prompts of lengths 3, 3 and 5, six new tokens each


def _run(*args: str) -> dict:
    result = diagnose("--format", "json", str(PROGRAM), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def eager() -> dict:
    return _run()


@pytest.fixture(scope="module")
def compiled() -> dict:
    return _run("--compiled")


def test_generate_with_a_static_cache_would_compile_itself_as_torchtpu_refuses(eager):
    """On a TPU, generate compiles the forward itself with a static cache, with CompileConfig's
    backend='inductor' and mode='reduce-overhead': both raise on TorchTPU. The CPU standing in
    does not compile (not on Transformers' device list), so this is predicted from the call."""
    document = _run("--static")
    [incompatible] = [f for f in document["findings"] if f["kind"] == "tpu-incompatible"]
    assert incompatible["line"] == GENERATE_LINE
    assert incompatible["op"] == "generate's own torch.compile(backend='inductor', mode='reduce-overhead')"
    assert "disable_compile=True" in incompatible["explanation"]
    assert not any(f["kind"] == "tpu-incompatible" for f in eager["findings"])  # a growing cache: no compile


def test_generates_stop_check_is_a_host_sync_at_the_users_generate_line(eager):
    """generate reads the device after every token (whether all sequences finished): a read inside
    the library, reported at the line that called generate, with the library's own line."""
    [sync] = [f for f in eager["findings"] if f["kind"] == "sync" and f["line"] == GENERATE_LINE]
    assert sync["via"] and all(site.startswith("transformers/") for site in sync["via"])
    reads = sync["library_reads"]
    assert all(site.startswith("transformers/") for site in reads)
    # One library line reads once per generated token of every call: the stop check.
    assert CALLS * NEW_TOKENS in reads.values()
    assert sync["count"] == sum(reads.values())
    assert "max_new_tokens" in sync["explanation"] and "batch the prompts" in sync["explanation"]
    # torch's own reads (none of them the user's) are not reported; nothing else is found.
    assert {f["kind"] for f in eager["findings"]} == {"sync"}


def test_a_pipeline_call_reports_the_generate_it_makes(eager):
    """A text-generation pipeline calls generate per prompt: the stop check is the pipeline
    call's, as it is the generate line's without one (the same count, the same library line)."""
    document = _run("--pipeline")
    [sync] = [f for f in document["findings"] if f["kind"] == "sync" and f["op"] == "__bool__"]
    assert sync["line"] == PIPELINE_LINE
    [direct] = [f for f in eager["findings"] if f["kind"] == "sync"]
    assert sync["library_reads"] == direct["library_reads"]
    # The pipeline copies its outputs to the host itself (device=torch.device("cpu")): that copy is
    # the sync, and its postprocessing's reads of the copies (.numpy()) wait for nothing.
    ops = {f["op"] for f in document["findings"] if f["kind"] == "sync"}
    assert ops == {"__bool__", "to('cpu')"}
    copy = next(f for f in document["findings"] if f["op"] == "to('cpu')")
    assert all("pipelines/base.py" in site for site in copy["library_reads"])


def test_compiled_forward_is_timed_at_the_generate_line_first_call_per_shape_apart(compiled):
    [site] = compiled["costs"]["compiled_calls"]
    assert site["line"] == GENERATE_LINE and site["function"].endswith("forward")
    shapes = site["signatures"]
    # The prompt's prefill and each cache length are input shapes of their own, told apart by the
    # cache tensors the call got.
    assert len({s["inputs"] for s in shapes}) == len(shapes) > 2
    assert any("cache" in s["inputs"] for s in shapes)
    assert site["first_calls"] == len(shapes) and site["later_calls"] > 0
    prefill = next(s for s in shapes if s["inputs"].startswith("input_ids (1, 3)"))
    assert prefill["first_call_compiled"] and prefill["later_calls"] == 1  # the second prompt of 3
    assert prefill["later_mean_seconds"] < prefill["first_call_seconds"]
    assert compiled["costs"]["compile_seconds"] > 0  # no steps, yet it compiled


def test_compiled_generate_recompiles_per_token_without_a_static_cache(compiled):
    """dynamic=False (TorchTPU's): each new cache length is a graph; the pattern is named and the
    cost measured from the first calls at the new shapes."""
    recompile = next(f for f in compiled["findings"] if f["kind"] == "recompile" and f["line"] == GENERATE_LINE)
    assert "cache.layers[0].keys` dimension 2 grew by one" in recompile["message"]
    assert "a new graph per generated token" in recompile["message"]
    assert 'cache_implementation="static"' in recompile["message"]
    assert recompile["cost"]["seconds"] > 0 and "new input shape(s)" in recompile["cost"]["how"]
    assert any(f["kind"] == "recompile-limit" for f in compiled["findings"])
