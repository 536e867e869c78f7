"""`--fix-level safe`: conversions that only make sense together are applied together or not
at all. An unsafe fix held back keeps torch_xla's runtime in its file, so every conversion that
assumes TorchTPU's runtime waits with it; only those whose code also runs on torch_xla
(Rule.also_on_torch_xla) apply. tests/test_differential.py runs such an output under torch_xla."""

from __future__ import annotations

from tpu_migrate.rewrite.context import Options
from tpu_migrate.rewrite.engine import rewrite_bytes
from tpu_migrate.rules import load_catalog

SPAWNED = '''\
import torch
import torch.distributed as dist
import torch_xla.amp.syncfree as syncfree
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_backend
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.utils.utils as xu


def _mp_fn(index):
    dist.init_process_group("xla", init_method="xla://")
    device = xm.xla_device()
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = syncfree.SGD(model.parameters(), lr=0.1)
    data = xu.SampleGenerator(data=torch.zeros(8, 4), sample_count=4)
    for step, x in enumerate(data):
        loss = model(x.to(device)).sum()
        loss.backward()
        xm.optimizer_step(optimizer)
        xm.mark_step()
        if xm.get_ordinal() == 0:
            print(step, loss.item())


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
'''


def rewrite(source: str, fix_level: str, target: str = "tpu"):
    result = rewrite_bytes(source.encode(), "t.py", Options(target=target, fix_level=fix_level))
    return result, (result.output.decode() if result.changed else source)


def test_a_held_launch_holds_what_assumes_torchtpu_and_applies_what_runs_on_both():
    result, text = rewrite(SPAWNED, "safe")
    # What runs on torch_xla too converts: the plain optimizer and the list of batches.
    assert sorted(f.code for f in result.fixes) == ["TPU041", "TPU123"]
    assert "torch.optim.SGD(model.parameters(), lr=0.1)" in text
    assert "data = [torch.zeros(8, 4)] * 4" in text
    # The rest stays torch_xla's, the process group's backend import with it.
    for kept in ('dist.init_process_group("xla", init_method="xla://")', "device = xm.xla_device()",
                 "xm.optimizer_step(optimizer)", "xm.mark_step()", "if xm.get_ordinal() == 0:",
                 "import torch_xla.distributed.xla_backend\n", "xmp.spawn(_mp_fn, args=())"):
        assert kept in text, kept
    assert "TODO" not in text
    waiting = {m.code: m for m in result.manual if m.code != "TPU060"}
    assert sorted(waiting) == ["TPU001", "TPU010", "TPU021", "TPU030", "TPU070"]
    for finding in waiting.values():
        assert finding.message == ("not applied at --fix-level safe: it goes with TPU060 (line 26), an unsafe fix "
                                   "held back, and this file runs on torch_xla until both convert")
        assert not finding.todo
    spawn = next(m for m in result.manual if m.code == "TPU060")
    assert spawn.message.startswith("unsafe fix not applied at --fix-level safe")


def test_the_default_level_then_converts_them_together_as_in_one_run():
    _, safe = rewrite(SPAWNED, "safe")
    assert rewrite(safe, "safe")[1] == safe  # a fixed point at its level
    _, direct = rewrite(SPAWNED, "unsafe")
    _, in_two_runs = rewrite(safe, "unsafe")
    assert in_two_runs == direct
    assert "torch_xla" not in direct and 'torch.device("tpu")' in direct


def test_a_file_without_unsafe_fixes_converts_as_at_the_default_level():
    source = SPAWNED.replace("    xmp.spawn(_mp_fn, args=())\n", "    _mp_fn(0)\n").replace(
        "import torch_xla.distributed.xla_multiprocessing as xmp\n", "")
    safe, text = rewrite(source, "safe")
    assert not safe.manual and text == rewrite(source, "unsafe")[1]


def test_a_statement_whose_unsafe_fix_waits_gets_no_todo_comment():
    """TPU157 removes a print of the metrics report; while it waits, the TODO that TPU151 would
    write on the same statement would go stale (the statement goes): reported, not written."""
    source = "import torch_xla.debug.metrics as met\n\nprint(met.metrics_report())\nx = 1\n"
    result, text = rewrite(source, "safe")
    assert text == source
    assert [(m.code, m.todo) for m in result.manual] == [("TPU151", False), ("TPU157", False)]
    _, converted = rewrite(text, "unsafe")
    assert "metrics_report" not in converted and "TODO" not in converted


def test_only_conversions_that_run_on_torch_xla_too_are_marked_so():
    """A rule marked also_on_torch_xla must be safe, and its code must not name the native device
    or torch.distributed (which assume TorchTPU's runtime)."""
    marked = [rule for rule in load_catalog().rules if rule.also_on_torch_xla]
    assert sorted(rule.code for rule in marked) == ["TPU041", "TPU123", "TPU155"]
    for rule in marked:
        assert rule.safety == "safe"
        for template in rule.rename.values():
            assert "tpu" not in template and "dist" not in template
