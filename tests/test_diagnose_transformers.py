"""`diagnose` on real Hugging Face Transformers code (issues 27 and 50): a tiny random-init Llama
built from a config (nothing downloaded), trained for six steps and then asked to `generate`,
eager and with the model's forward compiled; `generate` alone with a static cache, and through a
text-generation pipeline; prompts whose lengths repeat and differ
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


def line_of(marker: str) -> int:
    return next(number for number, text in enumerate(LINES, 1) if marker in text)


TRAIN_LINE, LOG_LINE = line_of("expect: recompile (length 12)"), line_of("expect: sync every step")
TOLIST_LINE, NANSUM_LINE = line_of("expect: tolist per prompt"), line_of("expect: unsupported on TorchTPU")
COMPILE_LINE = line_of("expect: tpu-incompatible")
STEPS = 6
CALLS, NEW_TOKENS = 3, 6  # prompts of lengths 3, 3 and 5, six new tokens each


def _run(*args: str) -> dict:
    result = diagnose("--format", "json", str(PROGRAM), *args, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def eager() -> dict:
    return _run("--train")  # six training steps, then generate


@pytest.fixture(scope="module")
def compiled() -> dict:
    return _run("--train", "--compiled")


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
    # torch's own reads (none of them the user's) are not reported; the training's nansum is.
    assert {f["kind"] for f in eager["findings"]} == {"sync", "unsupported-op"}


def test_a_pipeline_call_reports_the_generate_it_makes(eager):
    """A text-generation pipeline calls generate per prompt: the stop check is the pipeline
    call's, as it is the generate line's without one (the same count, the same library line)."""
    document = _run("--pipeline")
    [sync] = [f for f in document["findings"] if f["kind"] == "sync" and f["op"] == "__bool__"]
    assert sync["line"] == PIPELINE_LINE
    [direct] = [f for f in eager["findings"] if f["kind"] == "sync" and f["line"] == GENERATE_LINE]
    # (the generate after training also checks its causal mask, which an untrained model's does not)
    generates = {site: n for site, n in direct["library_reads"].items() if "generation/" in site}
    assert sync["library_reads"] == generates and sync["via"][-1] == direct["via"][-1]
    # The pipeline copies its outputs to the host itself (device=torch.device("cpu")): that copy is
    # the sync, and its postprocessing's reads of the copies (.numpy()) wait for nothing.
    ops = {f["op"] for f in document["findings"] if f["kind"] == "sync"}
    assert ops == {"__bool__", "to('cpu')"}
    copy = next(f for f in document["findings"] if f["op"] == "to('cpu')")
    assert all("pipelines/base.py" in site for site in copy["library_reads"])


def test_compiled_forward_is_timed_at_the_generate_line_first_call_per_shape_apart(compiled):
    [site] = [s for s in compiled["costs"]["compiled_calls"] if s["line"] == GENERATE_LINE]
    assert site["function"].endswith("forward")
    shapes = site["signatures"]
    # The prompt's prefill and each cache length are input shapes of their own, told apart by the
    # cache tensors the call got.
    assert len({s["inputs"] for s in shapes}) == len(shapes) > 2
    assert any("cache" in s["inputs"] for s in shapes)
    assert site["first_calls"] == len(shapes) and site["later_calls"] > 0
    prefill = next(s for s in shapes if s["inputs"].startswith("input_ids (1, 3)"))
    assert prefill["first_call_compiled"]
    # Training's batches of 8 at the training line: one first call (compiled), then the steady state.
    [train] = [s for s in compiled["costs"]["compiled_calls"] if s["line"] == TRAIN_LINE]
    eight = train["signatures"][0]
    assert eight["inputs"].startswith("input_ids (2, 8)") and eight["later_calls"] == STEPS - 2
    assert eight["first_call_compiled"] and eight["later_mean_seconds"] < eight["first_call_seconds"]
    assert compiled["costs"]["compile_seconds"] > 0


def test_compiled_generate_recompiles_per_token_without_a_static_cache(compiled):
    """dynamic=False (TorchTPU's): each new cache length is a graph; the pattern is named and the
    cost measured from the first calls at the new shapes."""
    recompile = next(f for f in compiled["findings"] if f["kind"] == "recompile" and f["line"] == GENERATE_LINE)
    assert "cache.layers[0].keys` dimension 2 grew by one" in recompile["message"]
    assert "a new graph per generated token" in recompile["message"]
    assert 'cache_implementation="static"' in recompile["message"]
    assert recompile["cost"]["seconds"] > 0 and "new input shape(s)" in recompile["cost"]["how"]
    assert any(f["kind"] == "recompile-limit" for f in compiled["findings"])


def _ranked_by_what_fixing_saves(document: dict) -> None:
    """What fails on TorchTPU first; then costliest first, every compile priced."""
    findings = document["findings"]
    fails = [f["cost"]["fails_on_tpu"] for f in findings]
    assert fails == sorted(fails, reverse=True) and fails[0]
    saved = [f["cost"]["seconds"] or 0.0 for f in findings if not f["cost"]["fails_on_tpu"]]
    assert saved == sorted(saved, reverse=True)
    for f in findings:
        assert "not recorded one by one" not in f["message"]
        if f["kind"] in ("recompile", "compile"):
            assert f["cost"]["seconds"] > 0, f["message"]
    assert document["costs"]["summary"].startswith("1 finding(s) fail on TorchTPU, fix them first")


def _reads_after_training(document: dict) -> dict:
    """Generate's reads after the last optimizer step: findings, a loop being a loop."""
    reads = {(f["line"], f["op"]): f for f in document["findings"] if f["kind"] == "sync"}
    assert set(reads) == {(LOG_LINE, "item"), (GENERATE_LINE, "__bool__"), (TOLIST_LINE, "tolist")}
    assert reads[LOG_LINE, "item"]["count"] == STEPS and "every step" in reads[LOG_LINE, "item"]["message"]
    assert reads[TOLIST_LINE, "tolist"]["count"] == CALLS
    for key in ((GENERATE_LINE, "__bool__"), (TOLIST_LINE, "tolist")):
        assert "in a loop after the last step" in reads[key]["message"]
    stop = reads[GENERATE_LINE, "__bool__"]
    per_token = max(stop["library_reads"], key=stop["library_reads"].get)
    assert stop["library_reads"][per_token] == CALLS * NEW_TOKENS
    assert stop["via"][-1] == per_token  # the per-token read's place, not the first one's
    # A read waits for the work queued before it, but removing it saves at most the overlap it loses.
    for read in reads.values():
        cost = read["cost"]
        assert cost["estimate"] and cost["seconds"] <= cost["waits_seconds"]
        assert "removing it saves at most" in read["message"]
    assert not any("host reads not repeated" in note for note in document.get("notes", []))
    return reads


def test_trained_then_generated_eager_ranks_the_op_torchtpu_lacks_first(eager):
    """Eager training then generation: nansum (no TPU kernel) first, above any cost; then the
    reads by what removing them saves; generate's stop checks and .tolist()s are findings."""
    first = eager["findings"][0]
    assert (first["kind"], first["line"], first["op"]) == ("unsupported-op", NANSUM_LINE, "aten::nansum")
    assert "fails on TorchTPU, so it ranks first" in first["message"]
    _ranked_by_what_fixing_saves(eager)
    _reads_after_training(eager)
    assert len(eager["findings"]) == 4
    assert eager["steps"] == eager["optimizer_steps"] == STEPS


def test_trained_then_generated_compiled_prices_every_recompile_from_its_first_calls(compiled):
    """Compiled: dynamic=True (which TorchTPU refuses) first; the longer batch's recompile (in a
    training step) and generate's recompiles (after the last step) are priced from the first calls
    the compiled-calls table timed, and rank above the reads."""
    first = compiled["findings"][0]
    assert (first["kind"], first["line"], first["op"]) == ("tpu-incompatible", COMPILE_LINE, "torch.compile(dynamic=True)")
    _ranked_by_what_fixing_saves(compiled)
    compiles = {(f["kind"], f["line"]): f for f in compiled["findings"] if f["kind"] in ("recompile", "compile")}
    assert set(compiles) == {("recompile", TRAIN_LINE), ("recompile", GENERATE_LINE), ("compile", GENERATE_LINE)}
    for f in compiles.values():
        assert "first calls at" in f["cost"]["how"] and "compiled-calls table" in f["cost"]["how"]
    train = compiles["recompile", TRAIN_LINE]
    assert train["count"] == 1 and train["first_step"] == 3
    # The line that made the batch and the one that gave it its length, relative to the working directory.
    shape = f"the new shape comes from {PROGRAM.relative_to(ROOT)}:{TRAIN_LINE - 1} (fed by line {TRAIN_LINE - 2})"
    assert shape in train["message"], train["message"]
    second = compiles["compile", GENERATE_LINE]["message"]
    assert "a second graph of the compiled code called here" in second and "(called here)" not in second
    _reads_after_training(compiled)
    kinds = [f["kind"] for f in compiled["findings"]]
    assert kinds.count("sync") == 3 and kinds.count("recompile-limit") == 1 and len(kinds) == 8
