"""verify's comparison on step records and printed output written by hand: FSDP shards added over
the ranks, whole tensors required to agree between them, backward calls where no optimizer
steps, printed numbers (rounding, noise, the world size), and the first divergence with its cause."""

from __future__ import annotations

import io

from tpu_migrate.verify import compare, printed
from tpu_migrate.verify.runs import Run


def _record(step, rank, world, loss, grad_sq=0.0, grad_sq_sharded=0.0, param_sum=0.0, param_sum_sharded=0.0,
            lr=0.1):
    return {"optimizer": 0, "step": step, "rank": rank, "world": world, "losses": [loss], "lr": [lr],
            "grad_sq": grad_sq, "grad_sq_sharded": grad_sq_sharded, "param_sum": param_sum,
            "param_sum_sharded": param_sum_sharded, "where": "train.py:9: optimizer.step()"}


def _run(records, world=1, printed=""):
    return Run("run", "migrated", world, 0, "", records, printed)


def _original(records, printed="", again=None, floor=None):
    """The original's two runs (`again`: the second one's printed output, if it differs)."""
    reference = compare.original(_run(records, printed=printed), _run(records, printed=again or printed))
    reference.floor = floor or reference.floor
    return reference


ORIGINAL_RECORDS = [_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0), _record(1, 0, 1, 1.5, grad_sq=9.0, param_sum=9.0)]
ORIGINAL = _original(ORIGINAL_RECORDS)


def test_fsdp_shards_add_up_over_the_ranks():
    # Two ranks, each holding half of every parameter and gradient (FSDP2): 16 + 9 = 25, 4 + 6.
    sharded = _run([_record(0, r, 2, 2.0, grad_sq_sharded=g, param_sum_sharded=p) for r, g, p in ((0, 16.0, 4.0), (1, 9.0, 6.0))]
                   + [_record(1, r, 2, 1.5, grad_sq_sharded=4.5, param_sum_sharded=4.5) for r in (0, 1)], world=2)
    steps = compare.steps(sharded)
    assert steps[0].figures["gradient norm"] == 5.0 and steps[0].figures["parameters"] == 10.0
    assert compare.verdict(ORIGINAL, sharded, 1e-4, 1e-5).divergence is None


def test_ranks_with_different_whole_gradients_are_the_first_divergence():
    apart = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                  _record(0, 1, 2, 2.0, grad_sq=16.0, param_sum=10.0)], world=2)
    divergence = compare.verdict(ORIGINAL, apart, 1e-4, 1e-5).divergence
    assert (divergence.step, divergence.quantity, divergence.ranks) == (0, "gradient norm", [0, 1])
    assert "rank 0 5, rank 1 4" in divergence.cause and divergence.where == "train.py:9: optimizer.step()"


def test_the_original_s_own_noise_widens_the_tolerance():
    late = _run([_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0),
                 _record(1, 0, 1, 1.5 * (1 + 3e-4), grad_sq=9.0, param_sum=9.0)])
    assert compare.verdict(ORIGINAL, late, 1e-4, 0.0).divergence.quantity == "loss"
    noisy = _original(ORIGINAL_RECORDS, floor={"loss": 1e-4})  # its two runs differed by 1e-4: ten times that is tolerated
    assert compare.verdict(noisy, late, 1e-4, 0.0).divergence is None


def test_more_steps_by_the_world_size_names_the_sampler():
    """Every common step agrees, and each of 2 processes took the original's steps twice over."""
    one_step = _original([_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0)])
    twice = _run([_record(s, r, 2, 2.0, grad_sq=25.0, param_sum=10.0) for s in (0, 1) for r in (0, 1)], world=2)
    divergence = compare.verdict(one_step, twice, 1e-4, 1e-5).divergence
    assert (divergence.step, divergence.quantity, divergence.original, divergence.migrated) == (
        None, "optimizer steps", 1, 2)
    assert "does not shard" in divergence.cause


def test_the_html_page_marks_the_first_divergence():
    from tpu_migrate.verify import html

    apart = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                  _record(0, 1, 2, 2.0, grad_sq=16.0, param_sum=10.0)], world=2)
    verdict = compare.verdict(ORIGINAL, apart, 1e-4, 1e-5)
    page = html.render("train.py <1>", "its portable migration (the CPU, gloo)", ORIGINAL, [verdict])
    assert "train.py &lt;1&gt;" in page and "<1>" not in page  # escaped
    assert 'class="differs">differs</span> first at step 0, gradient norm' in page
    assert page.count('class="number diverged"') == 2  # the original's and the migrated value
    assert page.count("<tr><td") == 2  # a row per step, the original's second step shown too


def test_the_html_page_shows_the_run_that_differs_first_with_each_rank_and_the_printed_lines():
    """Issue 48, item 7: the differing run's section comes before the one that agrees; at its
    divergent step each rank's own figures (rank 1's gradient norm 4, rank 0's 5); and the
    printed lines of both sides, every rank's, side by side, the line a verdict names marked."""
    from tpu_migrate.verify import html

    same = compare.verdict(ORIGINAL, _run(ORIGINAL_RECORDS), 1e-4, 1e-5)
    apart_run = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                      _record(0, 1, 2, 2.0, grad_sq=16.0, param_sum=10.0)], world=2)
    apart_run.name = "migrated, torchrun, 2 processes"
    apart_run.ranks = [(0, True, "loss 2.0000\n"), (1, False, "loss 2.5000\n")]
    apart = compare.verdict(ORIGINAL, apart_run, 1e-4, 1e-5)
    page = html.render("train.py", "its portable migration (the CPU, gloo)", ORIGINAL, [same, apart])
    assert page.index("migrated, torchrun, 2 processes: <span") < page.index("run: <span class=\"same\">")
    ranks = page[page.index("<h3>each rank at step 0</h3>"):]
    assert '<tr class="rank"><td class="number">0</td><td class="number">2</td><td class="number">5</td>' in ranks
    assert '<tr class="rank"><td class="number">1</td><td class="number">2</td><td class="number">4</td>' in ranks
    assert "<th>migrated, rank 0</th><th>migrated, rank 1</th>" in page
    assert '<td class="line">loss 2.0000</td><td class="line">loss 2.5000</td>' in page

    printed_reference = _original(ORIGINAL_RECORDS, printed="epoch 1\nloss 0.5000\n")
    late = compare.verdict(printed_reference, _run(ORIGINAL_RECORDS, printed="epoch 1\nloss 0.7000\n"), 1e-4, 1e-5)
    assert late.divergence.unit == "printed line" and late.divergence.step == 2
    page = html.render("train.py", "its portable migration", printed_reference, [late])
    assert '<details open>' in page
    assert ('<tr class="printed diverged"><td class="number">2</td><td class="line">loss 0.5000</td>'
            '<td class="line">loss 0.7000</td></tr>') in page


def _backward(losses, rank=0, world=1):
    return {"backward": losses, "rank": rank, "world": world}


def test_a_program_without_optimizer_steps_is_compared_per_backward_call():
    """A hand-written update: no optimizer, a loss per backward() call, averaged over the ranks."""
    reference = _original([_backward([2.0, 1.5, 1.2])])
    assert reference.unit == "backward call" and len(reference.steps) == 3
    same = _run([_backward([2.5, 1.0, 1.4], 0, 2), _backward([1.5, 2.0, 1.0], 1, 2)], world=2)
    assert compare.verdict(reference, same, 1e-4, 1e-5).divergence is None
    later = _run([_backward([2.0, 1.5, 1.3])])
    divergence = compare.verdict(reference, later, 1e-4, 1e-5).divergence
    assert (divergence.unit, divergence.step, divergence.quantity) == ("backward call", 2, "loss")
    fewer = compare.verdict(reference, _run([_backward([2.0, 1.5])]), 1e-4, 1e-5).divergence
    assert (fewer.step, fewer.quantity, fewer.original, fewer.migrated) == (None, "backward calls", 3, 2)


ACCURACY = "epoch 1 loss=0.6931 took 12.31s\ntest accuracy 91.25% on 64 samples\n"


def test_printed_numbers_agree_up_to_their_last_digit_and_the_original_s_noise():
    """0.6932 for 0.6931 is float rounding in the last printed digit; the time differs between
    the original's own runs, so it is not compared; a line only one side prints shifts nothing."""
    reference = _original(ORIGINAL_RECORDS, ACCURACY, again=ACCURACY.replace("12.31", "11.87"))
    migrated = _run(ORIGINAL_RECORDS, printed="using device cpu:0\n" + ACCURACY.replace("0.6931 took 12.31",
                                                                                           "0.6932 took 3.02"))
    verdict = compare.verdict(reference, migrated, 1e-4, 1e-5)
    assert verdict.divergence is None
    assert (verdict.printed.compared, verdict.printed.noisy, verdict.printed.one_side) == (4, 1, 1)
    assert compare.printed_summary(verdict.printed) == (
        "4 printed numbers the same, 1 that differ between two runs of the original (times?) not compared, "
        "1 line(s) printed by one side only")


def test_a_printed_number_is_the_divergence_where_the_steps_agree():
    """An evaluation over rank 0's slice only (the reduction dropped): every step agrees."""
    reference = _original(ORIGINAL_RECORDS, ACCURACY)
    migrated = _run([{**r, "world": 2, "rank": k} for r in ORIGINAL_RECORDS for k in (0, 1)], world=2,
                    printed=ACCURACY.replace("91.25", "87.50"))
    divergence = compare.verdict(reference, migrated, 1e-4, 1e-5).divergence
    assert (divergence.unit, divergence.step, divergence.quantity) == ("printed line", 2, "printed number")
    assert (divergence.original, divergence.migrated) == (91.25, 87.5)
    assert "test accuracy 91.25% on 64 samples" in divergence.where
    assert "every step's loss, gradient norm and parameters agree" in divergence.cause
    assert "mesh_reduce" in divergence.cause


def test_a_printed_count_by_the_world_size_agrees_at_one_process_only():
    """64 samples in all at one process, 32 per process at two: by design, not a divergence."""
    reference = _original(ORIGINAL_RECORDS, ACCURACY + "world size 1\n")
    migrated = _run([{**r, "world": 2, "rank": k} for r in ORIGINAL_RECORDS for k in (0, 1)], world=2,
                    printed=ACCURACY.replace("64 samples", "32 samples") + "world size 2\n")
    verdict = compare.verdict(reference, migrated, 1e-4, 1e-5)
    assert verdict.divergence is None
    assert [(item["line"], item["why"].split(":")[0]) for item in verdict.printed.world_only] == [
        (2, "1/2 of the original's"), (3, "the world size itself (2)")]
    at_one = compare.verdict(reference, _run(ORIGINAL_RECORDS, printed=ACCURACY.replace("64 samples", "32 samples")
                                             + "world size 1\n"), 1e-4, 1e-5)
    assert at_one.divergence is not None and at_one.divergence.migrated == 32  # at one process, no excuse


def test_a_printed_loss_at_half_the_original_s_was_averaged_twice_not_counted_per_process():
    """Only integers count per process: a float at 1/N of the original's is a divergence."""
    reference = _original(ORIGINAL_RECORDS, "step 3 loss 0.5000\n")
    migrated = _run([{**r, "world": 2, "rank": k} for r in ORIGINAL_RECORDS for k in (0, 1)], world=2,
                    printed="step 3 loss 0.2500\n")
    divergence = compare.verdict(reference, migrated, 1e-4, 1e-5).divergence
    assert (divergence.quantity, divergence.original, divergence.migrated) == ("printed number", 0.5, 0.25)
    assert "1/2 of the original's: averaged over the 2 processes twice" in divergence.cause


def test_times_and_rates_are_never_compared_even_where_the_original_s_two_runs_agreed():
    """By their label or unit: two runs of the original that both took 12 s do not make 12 s the
    expected time (pytorch/xla's mnist once printed GlobalRate=66.01 twice, within 1e-3)."""
    reference = _original(ORIGINAL_RECORDS, "epoch 1 took 12 s, 3.5 it/s | Rate=948.47 GlobalRate=66.01 loss 0.5\n")
    migrated = _run(ORIGINAL_RECORDS,
                    printed="epoch 1 took 3 s, 20.1 it/s | Rate=5000.1 GlobalRate=4000.2 loss 0.5\n")
    verdict = compare.verdict(reference, migrated, 1e-4, 1e-5)
    assert verdict.divergence is None and (verdict.printed.compared, verdict.printed.noisy) == (2, 4)


def test_printed_numbers_are_found_where_a_reader_sees_them():
    lines = printed.lines("Loss is 0.5.\nv1.2.3 step10 x=-0.25 on xla:0\nno number here\n100%|####| 3/3\r\n"
                          "Epoch 1 train begin 18:14:36\n2026-12-03 18:14:36,512 loss 2\n")
    assert [(line.index, line.template, [n.value for n in line.numbers]) for line in lines] == [
        (1, "Loss is #.", [0.5]), (2, "v1.2.3 step10 x=# on xla:#", [-0.25, 0.0]), (4, "#%|####| #/#", [100, 3, 3]),
        (5, "Epoch # train begin <time>", [1]), (6, "<time> <time> loss #", [2])]


def test_lines_that_differ_in_a_word_compare_the_numbers_at_the_same_words():
    """pytorch/xla's mnist prints its device in its loss lines: `xla:0/0` becomes `cpu/0` in the
    migration, and the loss (not the device's index) is compared with the loss."""
    line = "| Training Device={} Epoch=1 Step=5 Loss={} Rate={} Time=18:16:13\n"
    reference = _original(ORIGINAL_RECORDS, line.format("xla:0/0", "2.21781", "70.74"),
                          again=line.format("xla:0/0", "2.21781", "1442.1"))
    same = compare.verdict(reference, _run(ORIGINAL_RECORDS, printed=line.format("cpu/0", "2.21782", "9.5")), 1e-4, 1e-5)
    assert same.divergence is None and (same.printed.compared, same.printed.noisy) == (4, 1)
    other = compare.verdict(reference, _run(ORIGINAL_RECORDS, printed=line.format("cpu/0", "2.31781", "9.5")), 1e-4, 1e-5)
    assert (other.divergence.original, other.divergence.migrated) == (2.21781, 2.31781)


def test_a_line_under_a_test_of_the_rank_or_through_master_print_is_printed_once(tmp_path):
    """guards.py on a program's source: the branches of an `if` that asks which process this is
    print once; a loop's `if step % 10 == 0` and a plain print every process."""
    import sys

    from tpu_migrate.diagnose.recording import is_library
    from tpu_migrate.verify import guards

    source = tmp_path / "train.py"
    source.write_text(
        "import sys\n"
        "def frame():\n    return ONCE(sys._getframe(1))\n"
        "def run(ordinal, step):\n"
        "    seen = {}\n"
        "    if ordinal == 0:\n        seen['master'] = frame()\n    else:\n        seen['other'] = frame()\n"
        "    if step % 10 == 0:\n        seen['every'] = frame()\n"
        "    seen['plain'] = frame()\n"
        "    return seen\n")
    namespace = {"ONCE": lambda frame: guards.printed_once(frame, is_library)}  # where the program prints
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    once = {**namespace["run"](0, 0), **namespace["run"](1, 0)}
    assert once == {"master": True, "other": True, "every": False, "plain": False}
    assert not guards.printed_once(sys._getframe(), lambda name: True)  # library frames only


def test_every_rank_s_lines_against_the_original_s_once_printed_and_reduced_numbers():
    """across_ranks: a once-printed line that rank 1 prints too is a divergence (not the first of
    another node's); a reduced number the ranks disagree on is one; one they agree on is noted."""
    original = printed.lines("step 0 loss 0.500000\neval error 0.250000\n")
    reduced = printed.reduced(original, [0.5, 0.25])
    assert reduced == {(1, 1), (2, 0)}
    rank0 = printed.lines("step 0 loss 0.500000\neval error 0.300000\n")
    rank1 = printed.lines("eval error 0.300000\n")
    divergence, agreed = printed.across_ranks(original, {1}, reduced, [(0, True, rank0), (1, False, rank1)], 1e-4, 1e-5)
    assert divergence is None and agreed == {(2, 0)}
    divergence, _ = printed.across_ranks(original, {1}, reduced, [(0, True, rank0), (1, False, rank0)], 1e-4, 1e-5)
    assert (divergence.kind, divergence.line, divergence.rank, divergence.migrated) == ("extra", 1, 1, 2)
    _, agreed = printed.across_ranks(original, {1}, reduced, [(0, True, rank0), (2, True, rank0)], 1e-4, 1e-5)
    assert agreed == {(1, 1), (2, 0)}  # rank 2 leads a node of its own: it may print the master's lines
    other = printed.lines("eval error 0.200000\n")
    divergence, _ = printed.across_ranks(original, {1}, reduced, [(0, True, rank0), (1, False, other)], 1e-4, 1e-5)
    assert (divergence.kind, divergence.line, divergence.original, divergence.migrated) == ("ranks", 2, 0.3, 0.2)


# A program that prints a value computed from reduced ones (issue 48, item 1c): each process's
# error over its own rows, a total and a count reduced, their ratio printed by every process.
REDUCED_RATIO = """\
def evaluate(xm, out, error):
    print(f"epoch 1 eval before {error:.6f}", file=out)
    total = xm.mesh_reduce("eval_total", 8 * error, sum)
    count = xm.mesh_reduce("eval_count", 8, sum)
    print(f"epoch 1 eval rmse {(total / count) ** 0.5:.6f} over {count} rows", file=out)
"""


def _printed_through_the_recorder(tmp_path, errors: list[float], world: int) -> list[str]:
    """What each rank prints (REDUCED_RATIO, mesh_reduce over `errors`), the first through the
    recorder's stdout (recorder._Tee, as in the original's process) into `tmp_path`."""
    from types import SimpleNamespace

    from tpu_migrate.verify import recorder

    source = tmp_path / "train.py"
    source.write_text(REDUCED_RATIO)
    namespace = {}
    exec(compile(REDUCED_RATIO, str(source), "exec"), namespace)
    mesh_reduce = (lambda tag, value, reduce: reduce([value * world])) if world == 1 else \
        (lambda tag, value, reduce: reduce([8 * e for e in errors]) if tag == "eval_total" else reduce([8] * world))
    texts = []
    for rank, error in enumerate(errors):
        tee = recorder._Tee(io.StringIO(), str(tmp_path / f"stdout-1-{100 + rank}-{rank}.txt"))
        namespace["evaluate"](SimpleNamespace(mesh_reduce=mesh_reduce), tee if rank == 0 else tee._stream, error)
        texts.append(tee._stream.getvalue())
    return texts


def test_a_value_computed_from_reduced_ones_must_agree_across_the_ranks(tmp_path):
    """`print(total / count)` of two mesh_reduces: its numbers are reduced (not the epoch, not the
    rank's own value printed before the reduction), read from the original's source by the
    recorder as it prints. A migration that dropped the reductions prints each rank's own ratio,
    rank 0's the one-process value: it passed (not a value any reduction returned); now the ranks
    disagree there. The correct migration's ratio over 16 rows agrees at one process only."""
    from tpu_migrate.verify.runs import _read_printed

    original_text, = _printed_through_the_recorder(tmp_path, [0.25], 1)
    text, once, derived = _read_printed(tmp_path)
    assert text == original_text and set(derived) == {2}
    reference = compare.original(*[Run("original", "original", 1, 0, "", [], text, once=once, derived=derived)] * 2)
    assert reference.reduced == {(2, 1), (2, 2)}  # the rmse and the count; not the epoch
    dropped = Run("migrated", "migrated", 2, 0, "", [], original_text,
                  ranks=[(0, True, original_text), (1, False, original_text.replace("0.250000", "0.360000")
                                                    .replace("0.500000", "0.600000"))])
    divergence = compare.verdict(reference, dropped, 1e-4, 1e-5).divergence
    assert (divergence.unit, divergence.step, divergence.ranks) == ("printed line", 2, [1])
    assert (divergence.original, divergence.migrated) == (0.5, 0.6)
    (tmp_path / "two").mkdir()
    rank0, rank1 = _printed_through_the_recorder(tmp_path / "two", [0.25, 0.36], 2)
    correct = Run("migrated", "migrated", 2, 0, "", [], rank0, ranks=[(0, True, rank0), (1, False, rank1)])
    result = compare.verdict(reference, correct, 1e-4, 1e-5)
    assert result.divergence is None, result.divergence
    assert [item["line"] for item in result.printed.world_only] == [2, 2]  # the rmse and the 16 rows


# --- The cause uses every run, the step counts and the per-rank figures (issue 48, item 4) ------

def test_ranks_with_the_same_gradients_and_other_parameters_dropped_the_initial_broadcast():
    """Averaged gradients (equal on every rank) and parameters that differ between the ranks: the
    ranks started from other weights. It was reported as "wrap the model in DDP"."""
    apart = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                  _record(0, 1, 2, 2.0, grad_sq=25.0, param_sum=12.0)], world=2)
    divergence = compare.verdict(ORIGINAL, apart, 1e-4, 1e-5).divergence
    assert (divergence.step, divergence.quantity) == (0, "parameters")
    assert "started from different weights" in divergence.cause and "initial broadcast" in divergence.cause
    assert "DistributedDataParallel, or all-reduce" not in divergence.cause


def test_a_schedule_over_another_number_of_steps_names_the_step_counts_not_the_world_size():
    """drop_last changed: a partial batch more, 3 steps for the original's 2, and a schedule set
    over the total steps gives another rate at step 0 (0.1 * 2/3). It was reported as "the program
    scales it by the number of processes", at one process as at two."""
    extra = [_record(k, r, 2, loss, grad_sq=g, param_sum=p, lr=lr) for r in (0, 1)
             for k, loss, g, p, lr in ((0, 2.0, 25.0, 10.0, 0.1 * 2 / 3), (1, 1.5, 9.0, 9.0, 0.05), (2, 1.0, 4.0, 8.0, 0.0))]
    divergence = compare.verdict(ORIGINAL, _run(extra, world=2), 1e-4, 1e-5).divergence
    assert (divergence.step, divergence.quantity) == (0, "learning rate")
    assert "takes 3 optimizer steps where the original took 2" in divergence.cause
    assert "drop_last" in divergence.cause and "number of processes" not in divergence.cause


def test_where_one_process_already_differs_the_n_process_cause_says_so():
    """The 1-process run differs at step 0; the 2-process run's loss too: its cause once said
    "it agrees at one process and differs at 2"."""
    alone = compare.verdict(ORIGINAL, _run([_record(0, 0, 1, 2.5, grad_sq=25.0, param_sum=10.0),
                                            _record(1, 0, 1, 1.7, grad_sq=9.0, param_sum=9.0)]), 1e-4, 1e-5)
    assert "one process already differs" in alone.divergence.cause
    two = _run([_record(0, r, 2, 2.5, grad_sq=25.0, param_sum=10.0) for r in (0, 1)]
               + [_record(1, r, 2, 1.7, grad_sq=9.0, param_sum=9.0) for r in (0, 1)], world=2)
    before = compare.verdict(ORIGINAL, two, 1e-4, 1e-5).divergence.cause
    assert "agree" in before  # alone: what it says without the 1-process run
    cause = compare.verdict(ORIGINAL, two, 1e-4, 1e-5, alone.divergence).divergence.cause
    assert cause.startswith("one process already differs (loss at step 0, above)") and "agrees at one" not in cause


# --- Rounding told from a real change (issue 48, item 2) ---------------------------------------

def _steps(n=6, world=1, **per_step):
    """n steps of one run (loss 2 - k/10, squared gradient norm 25 - k, parameters 10 - k/100);
    `per_step`: a figure's other value at some steps, {figure: {step: value}}."""
    records = []
    for k in range(n):
        figures = {"loss": 2.0 - 0.1 * k, "grad_sq": 25.0 - k, "param_sum": 10.0 - 0.01 * k}
        for figure, values in per_step.items():
            if k in values:
                figures[figure] = values[k]
        records += [_record(k, r, world, figures["loss"], grad_sq=figures["grad_sq"], param_sum=figures["param_sum"])
                    for r in range(world)]
    return records


SIX_STEPS = _original(_steps())


def test_a_one_step_excursion_of_the_gradient_norm_is_rounding_but_a_drift_or_a_lasting_change_is_not():
    """pytorch/xla's MNIST on the stand-in: the gradient norm 6.3e-4 off at two steps, every other
    figure within 7e-6, the printed losses equal: it failed at 1 process. A real change moves the
    loss or the parameters after it (drift), or lasts; that is still caught at the same step."""
    blip = {1: (25.0 - 1) * (1 + 6.3e-4) ** 2, 3: (25.0 - 3) * (1 - 6.3e-4) ** 2}
    result = compare.verdict(SIX_STEPS, _run(_steps(grad_sq=blip)), 1e-4, 0.0)
    assert result.divergence is None
    assert [(e["step"], e["quantity"]) for e in result.excursions] == [(1, "gradient norm"), (3, "gradient norm")]
    assert "2 one-step excursion(s) of one figure (gradient norm at step 1, gradient norm at step 3; up to 6.3e-04" \
        in compare.excursions_text(result.excursions)
    drifts = _steps(grad_sq={1: blip[1]}, param_sum={k: 10.0 - 0.01 * k + 1e-2 * (k - 1) for k in range(2, 6)})
    assert (compare.verdict(SIX_STEPS, _run(drifts), 1e-4, 0.0).divergence.step,
            compare.verdict(SIX_STEPS, _run(drifts), 1e-4, 0.0).divergence.quantity) == (1, "gradient norm")
    moves = _steps(grad_sq={1: blip[1]}, loss={4: 2.0 - 0.4 + 1e-3})  # the loss moves later
    assert compare.verdict(SIX_STEPS, _run(moves), 1e-4, 0.0).divergence.step == 1
    lasts = _steps(grad_sq={k: (25.0 - k) * 4 for k in range(6)})  # twice the norm, scale-free steps (Adam)
    assert compare.verdict(SIX_STEPS, _run(lasts), 1e-4, 0.0).divergence.step == 0
    last = _steps(grad_sq={5: 20.0 * (1 + 6.3e-4) ** 2})  # nothing after it to show that it did not drift
    assert compare.verdict(SIX_STEPS, _run(last), 1e-4, 0.0).divergence.step == 5
    large = _steps(grad_sq={1: 24.0 * 1.1 ** 2})  # 10%: no rounding
    assert compare.verdict(SIX_STEPS, _run(large), 1e-4, 0.0).divergence.step == 1


def _precise(records, autocast=(), params=("float32",)):
    return [{**r, "autocast": list(autocast), "param_dtypes": list(params)} for r in records]


def test_the_original_s_autocast_dtype_sets_the_tolerance_and_a_changed_one_is_a_divergence():
    """A bfloat16 autocast on both sides rounds the loss apart by 1e-4 to 8e-4 per step, and the
    parameters' checksum by up to 3.6e-4 (p08_autocast.py, portable): bfloat16's rounding (2^-8),
    not a difference (up to 4 units of its roundoff 2^-8); a drift beyond it still is one. An autocast the migration dropped is named,
    at its first step."""
    reference = _original(_precise(_steps(), ["bfloat16"]), "step 4 loss 0.921809196472168\n")
    rounded = _precise(_steps(loss={k: (2.0 - 0.1 * k) * (1 + 8e-4 * (-1) ** k) for k in range(6)},
                              param_sum={k: (10.0 - 0.01 * k) * (1 + 3.6e-4) for k in range(1, 6)}), ["bfloat16"])
    result = compare.verdict(reference, _run(rounded, printed="step 4 loss 0.9216372966766357\n"), 1e-4, 0.0)
    assert result.divergence is None, result.divergence
    assert result.printed.compared == 2  # the printed loss rounds as the loss does
    assert result.tolerance["loss"] == result.tolerance["parameters"] == 4 * 2.0 ** -8
    assert result.tolerance["learning rate"] == 1e-4
    assert compare.verdict(_original(_precise(_steps())), _run(_precise(_steps(loss={k: (2.0 - 0.1 * k) * (1 + 8e-4)
                                                                                       for k in range(6)}))),
                           1e-4, 0.0).divergence.quantity == "loss"  # in float32, 8e-4 is a difference
    assert compare.tolerance_text(result.tolerance, reference).endswith("(the original computes in bfloat16: its rounding)")
    drifted = _precise(_steps(param_sum={k: 10.0 - 0.01 * k + 8e-2 * k for k in range(1, 6)}), ["bfloat16"])
    drift = compare.verdict(reference, _run(drifted), 1e-4, 0.0).divergence
    assert (drift.step, drift.quantity) == (2, "parameters")
    dropped = compare.verdict(reference, _run(_precise(_steps()))  , 1e-4, 0.0).divergence
    assert (dropped.step, dropped.quantity, dropped.original, dropped.migrated) == (
        0, "precision", "autocast bfloat16, parameters float32", "autocast none, parameters float32")
    assert "the conversion changed the autocast region" in dropped.cause
    assert compare.verdict(_original(_precise(_steps())), _run(rounded), 1e-4, 0.0).divergence.quantity == "precision"


def test_the_user_s_expected_difference_per_quantity_and_per_printed_line():
    from tpu_migrate.verify.command import VerifyError, parse_tolerances

    assert parse_tolerances(["loss=1e-3", "grad-norm=2e-3", "printed:2=0.05", "printed=1e-3"]) == {
        "loss": 1e-3, "gradient norm": 2e-3, "printed:2": 0.05, "printed": 1e-3}
    for wrong in ("loss", "weights=1e-3", "printed:0=1", "loss=-1", "loss=x"):
        try:
            parse_tolerances([wrong])
        except VerifyError as exc:
            assert "give NAME=RTOL" in str(exc)
        else:
            raise AssertionError(wrong)
    moved = _steps(loss={k: (2.0 - 0.1 * k) * (1 + 5e-4) for k in range(6)})
    assert compare.verdict(SIX_STEPS, _run(moved), 1e-4, 0.0).divergence.quantity == "loss"
    assert compare.verdict(SIX_STEPS, _run(moved), 1e-4, 0.0, expected={"loss": 1e-3}).divergence is None
    reference = _original(ORIGINAL_RECORDS, ACCURACY)
    other = _run(ORIGINAL_RECORDS, printed=ACCURACY.replace("91.25", "90.00"))
    assert compare.verdict(reference, other, 1e-4, 1e-5).divergence.step == 2
    assert compare.verdict(reference, other, 1e-4, 1e-5, expected={"printed:2": 0.05}).divergence is None
    assert compare.verdict(reference, other, 1e-4, 1e-5, expected={"printed:1": 0.05}).divergence.step == 2


def test_a_draw_from_torch_xla_s_device_generator_is_said_plainly_with_its_line():
    """torch.randn(..., device=xla) in the original: the migration draws from another generator,
    the runs cannot agree, and the cause says so instead of blaming the conversion."""
    drew = [{**r, "device_rng": ["train.py:12: noise = torch.randn(8, 4, device=device)"]} if r["step"] >= 2 else r
            for r in _steps()]
    reference = _original(drew)
    assert reference.device_rng == (2, ["train.py:12: noise = torch.randn(8, 4, device=device)"])
    apart = compare.verdict(reference, _run(_steps(loss={2: 1.9, 3: 1.8})), 1e-4, 0.0).divergence
    assert (apart.step, apart.quantity) == (2, "loss")
    assert apart.cause.startswith("not comparable: the original draws random numbers from torch_xla's device "
                                  "generator (train.py:12: noise = torch.randn(8, 4, device=device))")
    before = compare.verdict(reference, _run(_steps(loss={1: 1.95})), 1e-4, 0.0).divergence
    assert before.step == 1 and "device generator" not in before.cause  # before the first draw: the conversion's


def test_a_step_without_a_backward_a_clipped_norm_exceeded_and_a_loss_by_the_world_size_are_named():
    """The causes of three of test_verify.py's mutations, on records written by hand: the optimizer
    stepped twice (a step with no loss: it was "drop_last changed", the steps being twice the
    original's), the clipping dropped (the original's norm held at a max_norm), the loss
    multiplied by the world size (it was "did not read equal slices")."""
    twice = _steps(2) + [{**r, "step": r["step"] + 2} for r in _steps(2)]
    twice[1] = {**twice[1], "losses": [], "param_sum": 11.0}  # stepped again, no backward since
    cause = compare.verdict(_original(_steps(2)), _run(twice), 1e-4, 0.0).divergence.cause
    assert "stepped again without a backward()" in cause and "drop_last" not in cause
    clipped = _original(_steps(4, grad_sq={k: 0.25 for k in range(4)}))
    dropped = compare.verdict(clipped, _run(_steps(4)), 1e-4, 0.0).divergence
    assert (dropped.step, dropped.quantity) == (0, "gradient norm")
    assert "0.5 at 4 of its steps, a clipping's max_norm" in dropped.cause
    assert compare.verdict(_original(_steps(4)), _run(_steps(4, grad_sq={0: 26.0})), 1e-4, 0.0).divergence.cause \
        .startswith("one process already differs")  # one norm of many that differ: no clipping
    scaled = _steps(2, world=2, loss={0: 4.0, 1: 3.8})
    cause = compare.verdict(_original(_steps(2)), _run(scaled, world=2), 1e-4, 0.0).divergence.cause
    assert cause.startswith("the loss is 2 times the original's, the world size 2") and "slices" not in cause
