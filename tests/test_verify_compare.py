"""verify's comparison on step records written by hand: FSDP shards added over the ranks, whole
tensors required to agree between them, and the first divergence with its cause."""

from __future__ import annotations

from tpu_migrate.verify import compare
from tpu_migrate.verify.runs import Run


def _record(step, rank, world, loss, grad_sq=0.0, grad_sq_sharded=0.0, param_sum=0.0, param_sum_sharded=0.0,
            lr=0.1):
    return {"optimizer": 0, "step": step, "rank": rank, "world": world, "losses": [loss], "lr": [lr],
            "grad_sq": grad_sq, "grad_sq_sharded": grad_sq_sharded, "param_sum": param_sum,
            "param_sum_sharded": param_sum_sharded, "where": "train.py:9: optimizer.step()"}


def _run(records, world=1):
    return Run("run", "migrated", world, 0, "", records)


ORIGINAL = compare.steps(_run([_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0),
                               _record(1, 0, 1, 1.5, grad_sq=9.0, param_sum=9.0)]))


def test_fsdp_shards_add_up_over_the_ranks():
    # Two ranks, each holding half of every parameter and gradient (FSDP2): 16 + 9 = 25, 4 + 6.
    sharded = _run([_record(0, r, 2, 2.0, grad_sq_sharded=g, param_sum_sharded=p) for r, g, p in ((0, 16.0, 4.0), (1, 9.0, 6.0))]
                   + [_record(1, r, 2, 1.5, grad_sq_sharded=4.5, param_sum_sharded=4.5) for r in (0, 1)], world=2)
    steps = compare.steps(sharded)
    assert steps[0].figures["gradient norm"] == 5.0 and steps[0].figures["parameters"] == 10.0
    assert compare.verdict(ORIGINAL, sharded, 1e-4, 1e-5, {}).divergence is None


def test_ranks_with_different_whole_gradients_are_the_first_divergence():
    apart = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                  _record(0, 1, 2, 2.0, grad_sq=16.0, param_sum=10.0)], world=2)
    divergence = compare.verdict(ORIGINAL, apart, 1e-4, 1e-5, {}).divergence
    assert (divergence.step, divergence.quantity, divergence.ranks) == (0, "gradient norm", [0, 1])
    assert "rank 0 5, rank 1 4" in divergence.cause and divergence.where == "train.py:9: optimizer.step()"


def test_the_original_s_own_noise_widens_the_tolerance():
    late = _run([_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0),
                 _record(1, 0, 1, 1.5 * (1 + 3e-4), grad_sq=9.0, param_sum=9.0)])
    assert compare.verdict(ORIGINAL, late, 1e-4, 0.0, {}).divergence.quantity == "loss"
    noisy = {"loss": 1e-4}  # the original's two runs differed by 1e-4: ten times that is tolerated
    assert compare.verdict(ORIGINAL, late, 1e-4, 0.0, noisy).divergence is None


def test_more_steps_by_the_world_size_names_the_sampler():
    """Every common step agrees, and each of 2 processes took the original's steps twice over."""
    one_step = compare.steps(_run([_record(0, 0, 1, 2.0, grad_sq=25.0, param_sum=10.0)]))
    twice = _run([_record(s, r, 2, 2.0, grad_sq=25.0, param_sum=10.0) for s in (0, 1) for r in (0, 1)], world=2)
    divergence = compare.verdict(one_step, twice, 1e-4, 1e-5, {}).divergence
    assert (divergence.step, divergence.quantity, divergence.original, divergence.migrated) == (
        None, "optimizer steps", 1, 2)
    assert "does not shard" in divergence.cause


def test_the_html_page_marks_the_first_divergence():
    from tpu_migrate.verify import html

    apart = _run([_record(0, 0, 2, 2.0, grad_sq=25.0, param_sum=10.0),
                  _record(0, 1, 2, 2.0, grad_sq=16.0, param_sum=10.0)], world=2)
    verdict = compare.verdict(ORIGINAL, apart, 1e-4, 1e-5, {})
    page = html.render("train.py <1>", None, ORIGINAL, dict.fromkeys(compare.QUANTITIES, 0.0), [verdict])
    assert "train.py &lt;1&gt;" in page and "<1>" not in page  # escaped
    assert 'class="differs">differs</span> first at step 0, gradient norm' in page
    assert page.count('class="number diverged"') == 2  # the original's and the migrated value
    assert page.count("<tr><td") == 2  # a row per step, the original's second step shown too
