"""From the runs' step records to "same" or the first divergence, with its likely cause.

Per optimizer step, each run gives four figures for the whole world:
- the learning rate of each parameter group (a schedule or a scaling by the world size shows
  here first, before it shows in the numbers it changes);
- the loss: the losses passed to backward() since the previous step, summed in each process
  (gradient accumulation), averaged over the processes (each holds an equal slice of the
  global batch, whose mean loss is then the mean of theirs);
- the gradient norm the optimizer steps with: the whole gradients of one rank (data parallel:
  every rank holds the same) plus every rank's FSDP shards;
- a parameter checksum after the step, made the same way.
Where every rank must hold the same whole tensors, the ranks are compared first: ranks that
step with different gradients have not averaged them.

A program that never steps an optimizer but calls backward() (a hand-written update) is
compared call by call on the loss alone. Then, where the steps agree, the numbers the program
printed (printed.py).

Rounding, told from a real change:
- the tolerance of each figure is the largest of --rtol (or the user's own for that quantity),
  ten times the original's run-to-run noise, and, where the original computed in a dtype of
  fewer bits (an autocast region, parameters cast to it), that dtype's rounding (the loss, the
  gradient norm and the parameters, which steps with gradients so rounded move apart). What the
  steps computed in is compared first: an autocast or a parameter dtype the migration changed is
  a divergence of its own;
- one figure off at one step, the loss or the gradient norm (a sum over many rounded values),
  is an excursion, not a divergence, where nothing it feeds moves: the step after agrees on it,
  the loss agrees at every later step and the parameters at that step and every later one (they
  do not drift). A real change (a dropped average, a scaled rate, another op) moves the loss or
  the parameters, or persists. The excursions are said with the verdict.

The original may draw random numbers from torch_xla's device generator (recorder.py notes the
line): no other device's generator gives the same numbers, and where the runs differ from that
step on, the cause says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpu_migrate.verify import printed
from tpu_migrate.verify.runs import Run

QUANTITIES = ("learning rate", "loss", "gradient norm", "parameters")
# How far apart two correct computations in a dtype of fewer bits than float32 can be, relatively:
# each rounds a value by up to its unit roundoff u (2^-8 for bfloat16, 2^-11 for float16), and a
# square (a norm, a squared error) doubles that: 4u. A loss over 16 bfloat16 values, 1.3u apart.
ROUNDING = {"bfloat16": 4 * 2.0 ** -8, "float16": 4 * 2.0 ** -11}
EXCURSION = ("loss", "gradient norm")  # figures one rounded step can move alone
EXCURSION_LIMIT = 100  # an excursion is within this many times its tolerance: rounding, not 10%


@dataclass
class Step:
    optimizer: int
    index: int
    ranks: list[int]
    figures: dict[str, float | None]   # quantity -> value (loss None where no backward was seen)
    where: str | None = None           # the program line that called optimizer.step()
    rank_mismatch: str | None = None   # a whole-tensor figure the ranks disagree on, and how
    unit: str = "step"                 # or "backward call", in a program without optimizer steps
    precision: str | None = None       # what it computed in ("autocast bfloat16, parameters float32"); None: not recorded
    device_rng: list[str] = field(default_factory=list)  # lines that drew from torch_xla's device generator so far


@dataclass
class Divergence:
    run: str
    step: int | None                  # None: the step counts differ, every common step agreed
    quantity: str
    original: float | int | None
    migrated: float | int | None
    ranks: list[int]
    cause: str
    where: str | None = None
    unit: str = "step"                # "step", "backward call" or "printed line" (step is then its number)


@dataclass
class Original:
    """The original's two runs: its figures, and its own noise between them."""
    steps: list[Step]
    floor: dict[str, float]            # relative difference per quantity between the two runs
    printed: list[printed.Line]
    printed_noise: set[tuple[int, int]]
    once: set[int] = field(default_factory=set)                 # printed lines printed by one process only
    reduced: set[tuple[int, int]] = field(default_factory=set)  # printed numbers a reduction returned, or
    #                                                              computed from reduced values

    @property
    def unit(self) -> str:
        return self.steps[0].unit if self.steps else "step"

    @property
    def device_rng(self) -> tuple[int, list[str]] | None:
        """(the first step whose figures a draw from torch_xla's device generator can have changed,
        the program's lines that drew), or None where it drew none."""
        return next(((step.index, step.device_rng) for step in self.steps if step.device_rng), None)

    def rounding(self) -> dict[str, float]:
        """Per quantity, the rounding of the dtype of fewest bits the original computed in."""
        autocast = params = 0.0
        for step in self.steps:
            regions, held = _dtypes(step.precision)
            autocast = max([autocast, *(ROUNDING.get(dtype, 0.0) for dtype in regions)])
            params = max([params, *(ROUNDING.get(dtype, 0.0) for dtype in held)])
        # Float32 parameters updated from gradients rounded so move apart by that rounding too (their
        # checksum, a sum of both signs, more than any one of them: 3.6e-4 under bfloat16 in p08).
        low = max(autocast, params)
        return {"learning rate": 0.0, "loss": low, "gradient norm": low, "parameters": low}


@dataclass
class Verdict:
    run: Run
    steps: int
    divergence: Divergence | None
    tolerance: dict[str, float] = field(default_factory=dict)  # rtol per quantity, noise included
    printed: printed.Printed | None = None  # None: not compared (the steps differ first)
    excursions: list[dict] = field(default_factory=list)  # one figure off at one step, nothing it feeds moved


def original(first: Run, second: Run) -> Original:
    figures = steps(first)
    lines = printed.lines(first.printed)
    return Original(figures, noise(figures, steps(second)), lines, printed.noise(lines, printed.lines(second.printed)),
                    first.once, printed.reduced(lines, first.reduced) | printed.derived(lines, first.derived))


def steps(run: Run) -> list[Step]:
    """The run's optimizer steps; in a program without any, its backward() calls."""
    by_step: dict[tuple[int, int], list[dict]] = {}
    for record in run.records:
        if "backward" not in record:
            by_step.setdefault((record["optimizer"], record["step"]), []).append(record)
    if not by_step:
        return _backward_calls(run)
    out = []
    for (optimizer, index), records in sorted(by_step.items(), key=lambda item: (item[0][1], item[0][0])):
        records.sort(key=lambda r: r["rank"])
        first = records[0]
        losses = [sum(r["losses"]) for r in records if r["losses"]]
        step = Step(optimizer, index, [r["rank"] for r in records], {
            "learning rate": max(first.get("lr") or [0.0]),
            "loss": sum(losses) / len(losses) if len(losses) == len(records) else None,
            "gradient norm": math.sqrt(first["grad_sq"] + sum(r["grad_sq_sharded"] for r in records)),
            "parameters": first["param_sum"] + sum(r["param_sum_sharded"] for r in records),
        }, where=first.get("where"), precision=_precision(first),
                    device_rng=first.get("device_rng", []))
        for key, name, shown in (("grad_sq", "gradient norms", math.sqrt), ("param_sum", "parameters", float)):
            values = [r[key] for r in records]
            if not all(_close(values[0], v, 1e-6, 0.0) for v in values[1:]):
                step.rank_mismatch = f"{name}: " + ", ".join(f"rank {r['rank']} {shown(r[key]):.6g}" for r in records)
                break
        out.append(step)
    return out


def _precision(record: dict) -> str | None:
    if "param_dtypes" not in record:
        return None
    autocast = ", ".join(record.get("autocast") or []) or "none"
    return f"autocast {autocast}, parameters {', '.join(record['param_dtypes'])}"


def _dtypes(precision: str | None) -> tuple[list[str], list[str]]:
    """A Step's precision, back to (the autocast dtypes, the parameters' dtypes)."""
    if not precision:
        return [], []
    regions, _, held = precision.removeprefix("autocast ").partition(", parameters ")
    return [d for d in regions.split(", ") if d != "none"], held.split(", ")


def _backward_calls(run: Run) -> list[Step]:
    """Per backward() call of a program that steps no optimizer: its loss, averaged over the ranks."""
    by_rank = {r["rank"]: r["backward"] for r in run.records if "backward" in r}
    drew = next((r["device_rng"] for r in run.records if r.get("device_rng")), [])
    calls = min((len(losses) for losses in by_rank.values()), default=0)
    ranks = sorted(by_rank)
    return [Step(0, k, ranks, {"learning rate": None, "loss": sum(by_rank[r][k] for r in ranks) / len(ranks),
                               "gradient norm": None, "parameters": None}, unit="backward call",
                 device_rng=drew if k == 0 else [])
            for k in range(calls)]


def noise(first: list[Step], second: list[Step]) -> dict[str, float]:
    """The largest relative difference of each figure between two runs of the original."""
    worst = dict.fromkeys(QUANTITIES, 0.0)
    for a, b in zip(first, second):
        for quantity in QUANTITIES:
            x, y = a.figures[quantity], b.figures[quantity]
            if x is not None and y is not None:
                worst[quantity] = max(worst[quantity], abs(x - y) / max(abs(x), 1e-12))
    return worst


def verdict(reference: Original, run: Run, rtol: float, atol: float, alone: Divergence | None = None,
            one_process_ran: bool = True, expected: dict[str, float] | None = None) -> Verdict:
    """`run` against the original: the first step and quantity that differ; where every step
    agrees, the first printed number. `alone`: the 1-process run's divergence, for a run of more
    processes (its cause must not say that one process agrees); `one_process_ran`: whether there
    was a 1-process run (without one, nothing is said of it). `expected`: the user's own relative
    tolerance per quantity (QUANTITIES, "printed", "printed:LINE": a line of the original's
    output), in place of `rtol` (tolerances())."""
    expected = expected or {}
    result = _steps_verdict(reference, run, tolerances(reference, rtol, expected), atol, alone, one_process_ran)
    if result.divergence is None:
        across, agreed = None, set()
        # Printed numbers come of the same computation: the rounding of its dtype applies to them too.
        printed_rtol = expected.get("printed", max(rtol, reference.rounding()["loss"]))
        lines_rtol = {int(key.partition(":")[2]): value for key, value in expected.items()
                      if key.startswith("printed:")}
        if run.world > 1:  # every rank's lines: what rank 0's cannot show (printed.py)
            ranks = [(rank, first, printed.lines(text)) for rank, first, text in run.ranks]
            across, agreed = printed.across_ranks(reference.printed, reference.once, reference.reduced, ranks,
                                                  printed_rtol, atol)
        result.printed = printed.compare(reference.printed, printed.lines(run.printed), reference.printed_noise,
                                         printed_rtol, atol, run.world, agreed, lines_rtol)
        # The first line either finds: across_ranks stops at its first, so numbers it would have
        # found agreed further down are unknown to compare (a later line is no first divergence).
        mismatch = min((m for m in (result.printed.divergence, across) if m is not None), key=lambda m: m.line,
                       default=None)
        if mismatch is not None:
            cause = _device_rng_cause(reference, None) or \
                _printed_cause(run.world, reference.unit if reference.steps else None, mismatch)
            quantity = "processes that print it" if mismatch.kind == "extra" else "printed number"
            result.divergence = Divergence(run.name, mismatch.line, quantity, mismatch.original,
                                           mismatch.migrated, [mismatch.rank], cause,
                                           f"{mismatch.text}  |  {mismatch.migrated_text}", unit="printed line")
    return result


def tolerances(reference: Original, rtol: float, expected: dict[str, float] | None = None) -> dict[str, float]:
    """The relative tolerance of each figure: the user's (`expected`), else the larger of `rtol`
    and the rounding of the dtype the original computed in; never below ten times the original's
    own run-to-run noise (a difference between two runs of the same program is no migration's)."""
    expected, rounding = expected or {}, reference.rounding()
    return {q: max(expected.get(q, max(rtol, rounding[q])), 10 * reference.floor.get(q, 0.0)) for q in QUANTITIES}


def _steps_verdict(reference: Original, run: Run, tolerance: dict[str, float], atol: float,
                   alone: Divergence | None = None, one_process_ran: bool = True) -> Verdict:
    original = reference.steps
    migrated = steps(run)
    result = Verdict(run, len(migrated), None, tolerance)
    pairs = list(zip(original, migrated))
    off = [[q for q in QUANTITIES if not _agrees(a, b, q, tolerance[q], atol)] for a, b in pairs]
    for k, (a, b) in enumerate(pairs):
        if b.rank_mismatch:
            quantity = "gradient norm" if b.rank_mismatch.startswith("gradient") else "parameters"
            if quantity == "parameters":  # the same (averaged) gradients, other weights: other starts
                cause = (f"the ranks disagree ({b.rank_mismatch}) though they step with the same gradients: they "
                         "started from different weights, which the average of the gradients never brings "
                         "together: the initial broadcast of the parameters is missing (xm.broadcast_master_param, "
                         "dist.broadcast from rank 0, or DistributedDataParallel's at its construction), or each "
                         "process initialized its model with a seed of its own")
            else:
                cause = (f"the ranks disagree ({b.rank_mismatch}): each process stepped with its own gradients, not "
                         "their average over the processes: wrap the model in DistributedDataParallel, or "
                         "all-reduce the gradients with ReduceOp.AVG before the step")
            result.divergence = Divergence(run.name, b.index, quantity, a.figures[quantity], b.figures[quantity],
                                           b.ranks, cause, b.where)
            return result
        if a.precision and b.precision and a.precision != b.precision:
            cause = (f"the original computed this step in {a.precision.replace('autocast none', 'no autocast')}, the "
                     f"migrated program in {b.precision.replace('autocast none', 'no autocast')}: the conversion "
                     "changed the autocast region (dropped, another dtype, another device type that does not "
                     "autocast) or the parameters' dtype")
            result.divergence = Divergence(run.name, b.index, "precision", a.precision, b.precision, b.ranks, cause,
                                           b.where, a.unit)
            return result
        if not off[k]:
            continue
        if _excursion(k, pairs, off, tolerance, run.world):
            quantity = off[k][0]
            result.excursions.append({"step": a.index, "quantity": quantity, "original": a.figures[quantity],
                                      "migrated": b.figures[quantity]})
            continue
        quantity = off[k][0]
        x, y = a.figures[quantity], b.figures[quantity]
        cause = _device_rng_cause(reference, b.index) or _stepped_again(pairs[:k + 1]) or _cause(
            quantity, x, y, run.world, b.index, (len(original), len(migrated)), alone,
            one_process_ran and alone is None, _clipped_at(original, k))
        result.divergence = Divergence(run.name, b.index, quantity, x, y, b.ranks, cause, b.where, a.unit)
        return result
    if len(original) != len(migrated):
        unit = (original or migrated)[0].unit
        result.divergence = Divergence(run.name, None, "optimizer steps" if unit == "step" else "backward calls",
                                       len(original), len(migrated), sorted({r for s in migrated for r in s.ranks}),
                                       _count_cause(len(original), len(migrated), run.world), unit=unit)
    return result


def _agrees(a: Step, b: Step, quantity: str, rtol: float, atol: float) -> bool:
    x, y = a.figures[quantity], b.figures[quantity]
    return x is None or y is None or _close(x, y, rtol, atol)


def _excursion(k: int, pairs: list[tuple[Step, Step]], off: list[list[str]], tolerance: dict[str, float],
               world: int) -> bool:
    """Whether step k's difference is one sensitive figure's rounding: the loss or the gradient
    norm alone, within EXCURSION_LIMIT tolerances (and not the world size times the original's),
    the parameters recorded and agreeing at that step; at the next step that figure agrees again,
    and at every later step the loss and the parameters agree (a real change drifts)."""
    a, b = pairs[k]
    if len(off[k]) != 1 or off[k][0] not in EXCURSION or k + 1 >= len(pairs) or a.figures["parameters"] is None:
        return False
    quantity = off[k][0]
    x, y = a.figures[quantity], b.figures[quantity]
    if printed.world_scale(x, y, world, 0.05) or abs(x - y) > EXCURSION_LIMIT * tolerance[quantity] * abs(x):
        return False
    return quantity not in off[k + 1] and not any("loss" in o or "parameters" in o for o in off[k + 1:])


def _stepped_again(pairs: list[tuple[Step, Step]]) -> str | None:
    """Where the migrated program stepped with no backward() since its previous step and the
    original never did: the optimizer stepped twice per batch (its step count grows with it,
    which is no drop_last)."""
    again = next((b for a, b in pairs if a.unit == "step" and b.figures["loss"] is None
                  and a.figures["loss"] is not None), None)
    if again is None:
        return None
    return (f"the migrated program stepped again without a backward() since its previous step (step {again.index}, "
            "no loss; the original computed one before every step): optimizer.step() is called twice per batch "
            "(a step added beside one the original made, as xm.optimizer_step kept and optimizer.step() added)")


def _clipped_at(original: list[Step], k: int) -> int:
    """How many of the original's steps have step k's gradient norm (to 1e-5): more than one, and
    it is a clipping's max_norm (clip_grad_norm_ scales every step's gradients above it to it)."""
    norm = original[k].figures["gradient norm"] if k < len(original) else None
    if not norm:
        return 0
    return sum(1 for step in original if step.figures["gradient norm"] is not None
               and _close(step.figures["gradient norm"], norm, 1e-5, 0.0))


def _device_rng_cause(reference: Original, step: int | None) -> str | None:
    """Where the original drew from torch_xla's device generator at or before `step` (None: a
    printed number, after every step), the plain reason the runs cannot agree."""
    drew = reference.device_rng
    if drew is None or (step is not None and step < drew[0]):
        return None
    return (f"not comparable: the original draws random numbers from torch_xla's device generator "
            f"({'; '.join(line or 'a line verify cannot see' for line in drew[1])}), the migrated program from "
            "another device's (the CPU's, or the stand-in's): no seed makes two generators give the same numbers, "
            "so from that draw on the runs cannot agree, and this difference says nothing of the migration. To "
            "compare them, draw on the CPU and move the result to the device (torch.randn(..., "
            "device='cpu').to(device)) in the original, or turn the random layers off (dropout p=0)")


def where_label(divergence: Divergence) -> str:
    """What a divergence's `where` is, as the reports label it."""
    return "printed" if divergence.unit == "printed line" else f"at the {divergence.unit}"


def shown(value: float | int | None) -> str:
    """A figure as the reports print it."""
    if value is None:
        return "-"
    return f"{value:.8g}" if isinstance(value, float) else str(value)


def counted(reference: Original) -> str:
    """What the original gave to compare: "5 optimizer steps", "3 backward calls (no optimizer
    step)" or "no optimizer step or backward call"; and its printed numbers."""
    n = len(reference.steps)
    if reference.unit == "backward call":
        what = f"{n} backward call{'s' * (n != 1)} (no optimizer step)"
    else:
        what = f"{n} optimizer step{'s' * (n != 1)}" if n else "no optimizer step or backward call"
    numbers = sum(len(line.numbers) for line in reference.printed)
    return f"{what}, {numbers} printed number{'s' * (numbers != 1)} on {len(reference.printed)} line(s)"


def printed_summary(result: printed.Printed | None) -> str:
    """What the printed numbers came to, in a few words."""
    if result is None:
        return "printed numbers not compared"
    parts = [f"{result.compared} printed number{'s' * (result.compared != 1)} the same"]
    if result.noisy:
        parts.append(f"{result.noisy} that differ between two runs of the original (times?) not compared")
    if result.world_only:
        parts.append(f"{len(result.world_only)} at 1 process only, by the world size")
    if result.one_side:
        parts.append(f"{result.one_side} line(s) printed by one side only")
    return ", ".join(parts)


def tolerance_text(tolerance: dict[str, float], reference: Original) -> str:
    """The tolerances a verdict used: "rtol 1e-04", or per figure where they differ; with the
    dtype whose rounding widened them."""
    values = {q: tolerance[q] for q in QUANTITIES if q in tolerance}
    if len(set(values.values())) <= 1:
        text = f"rtol {max(values.values(), default=0.0):.0e}"
    else:
        text = "rtol " + ", ".join(f"{q} {v:.0e}" for q, v in values.items())
    low = [dtype for dtype in ROUNDING if any(dtype in sum(_dtypes(step.precision), []) for step in reference.steps)]
    return text + (f" (the original computes in {' and '.join(low)}: its rounding)" if low else "")


def excursions_text(excursions: list[dict]) -> str:
    """The excursions a verdict let pass, in a line."""
    worst = max(abs(e["migrated"] - e["original"]) / max(abs(e["original"]), 1e-12) for e in excursions)
    where = ", ".join(f"{e['quantity']} at step {e['step']}" for e in excursions[:6])
    return (f"rounding, not a divergence: {len(excursions)} one-step excursion(s) of one figure ({where}; up to "
            f"{worst:.1e} relative), the step after agreeing and the loss and parameters agreeing at every later "
            "step (no drift)")


def noise_text(floor: dict[str, float]) -> str:
    """The original's own run-to-run noise, per figure (the learning rate has none to speak of)."""
    return ", ".join(f"{q} {floor[q]:.1e}" for q in QUANTITIES if q != "learning rate")


def _close(x: float, y: float, rtol: float, atol: float) -> bool:
    return math.isclose(x, y, rel_tol=rtol, abs_tol=atol)


def _cause(quantity: str, original: float, migrated: float, world: int, step: int,
           counts: tuple[int, int] = (0, 0), alone: Divergence | None = None, one_process_agreed: bool = True,
           clipped: int = 0) -> str:
    ratio = migrated / original if original else math.inf
    if quantity == "learning rate" and world > 1 and math.isclose(ratio, world):
        return (f"the learning rate is {ratio:.3g} times the original's, the world size {world}: the program "
                "scales it by the number of processes (by design where each process reads a batch of its own, "
                "the global batch growing with the world: then its numbers agree at one process only)")
    if counts[0] != counts[1] and not (world > 1 and counts[1] in (counts[0] * world, counts[0] / world)) \
            and (quantity == "learning rate" or step > 0):
        # Another number of batches: a partial last batch kept (drop_last), another dataset length;
        # steps that agreed before it (a batch inserted), or a schedule over the total steps.
        return (f"the migrated program takes {counts[1]} optimizer steps where the original took {counts[0]}: it "
                "reads another number of batches (drop_last changed, so a partial batch is kept or dropped; "
                "another dataset length or batch size), which shifts every later step"
                + (", and a schedule set over the total steps gives other rates from the first"
                   if quantity == "learning rate" else ""))
    if quantity == "gradient norm":
        scale = printed.world_scale(original, migrated, world, 0.05)
        if scale == "times":
            return (f"the gradient norm is {world} times the original's: the gradients were summed over the "
                    f"{world} processes, not averaged (ReduceOp.SUM without dividing by the world size)")
        if scale == "fraction":
            return (f"the gradient norm is 1/{world} of the original's: the gradients were averaged over the "
                    "processes twice (an explicit average on top of DistributedDataParallel or FSDP)")
        if clipped > 1 and migrated > original:
            return (f"the original's gradient norm is {original:.6g} at {clipped} of its steps, a clipping's max_norm; "
                    "the migrated program's is larger: the gradient clipping (torch.nn.utils.clip_grad_norm_) was "
                    "dropped, or clips to another norm or before the gradients are averaged or unscaled")
    if quantity == "loss" and world > 1 and printed.world_scale(original, migrated, world, 0.05) == "times":
        return (f"the loss is {world} times the original's, the world size {world}: the program scales the loss it "
                "passes to backward() by the number of processes (multiplied by the world size, or summed over "
                "the processes where the original averaged), and its gradients with it")
    if world > 1 and alone is not None:
        return (f"one process already differs ({alone.quantity} at {alone.unit} {alone.step}, above): the same "
                "change shows here; fix the 1-process run first")
    if quantity == "learning rate":
        return (f"the learning rate is {ratio:.3g} times the original's: a schedule stepped differently (a "
                "scheduler stepped per batch where the original stepped it per epoch, or set over another "
                "number of steps), or a rate changed")
    if world == 1:
        return ("one process already differs: a conversion changed the computation itself (a device, a dtype, "
                "an optimizer step, a seed or a random number generator)")
    if step == 0 and quantity == "loss":
        return ("the processes' losses average to another value than the original's on the first step: they "
                "did not read equal slices of the same global batch (a rank answered 0, a sampler without "
                "num_replicas / rank, a per-process batch that is not a slice of a global one, data seeded "
                "differently per process), or the model takes a statistic over each process's slice where "
                "the original took it over the global batch (BatchNorm); if the program means its batch per "
                "process, its numbers depend on the world size by design and agree at 1 process only")
    agreed = "it agrees at one process and differs" if one_process_agreed else "it differs"
    return (f"{agreed} at {world}: what differs is how the processes share the "
            "work (the slices they read, the gradient average, a statistic taken over one process's slice), "
            "or the program's numbers depend on the world size by design (a batch per process that is not a "
            "slice of a global one): then they agree at one process only")


def _printed_cause(world: int, unit: str | None, mismatch: printed.PrintedDivergence) -> str:
    computed = {"step": "every step's loss, gradient norm and parameters agree, so ",
                "backward call": "every backward call's loss agrees, so ", None: ""}[unit]
    if mismatch.kind == "extra":
        return (f"{mismatch.migrated} processes print this line (rank {mismatch.rank} too) where the original "
                "printed it from one process only (xm.master_print, or under a test of xm.is_master_ordinal() or "
                "the ordinal): the test of the rank was dropped, or asks another rank than the original did")
    if mismatch.kind == "ranks":
        return (f"rank 0 printed {shown(mismatch.original)} and rank {mismatch.rank} {shown(mismatch.migrated)}: "
                "the original printed what a reduction over the processes returned (xm.mesh_reduce, "
                "xm.all_reduce), the same in every process; the migrated program prints a value of each "
                "process's own (the reduction dropped), whatever rank 0's shows")
    scale = printed.world_scale(mismatch.original, mismatch.migrated, world, 1e-3)
    if scale == "fraction":
        return (f"{computed}the printed value is 1/{world} of the original's: averaged over the {world} processes "
                "twice (a value already averaged, divided by the world size again)")
    if scale == "times":
        return (f"{computed}the printed value is {world} times the original's: summed over the {world} processes, "
                "not averaged (ReduceOp.SUM without dividing by the world size)")
    if world == 1:
        return (f"{computed}what differs is computed outside the training steps, already at one process: an "
                "evaluation, a metric, a value read from another tensor than the original read (a conversion "
                "of the code that computes or prints it)")
    return (f"{computed}what differs is a figure of one process's share at {world} processes: an evaluation or "
            "metric over rank 0's slice that the original reduced over the replicas (xm.mesh_reduce / "
            "xm.all_reduce dropped, or a sampler that shards the evaluation data); or the program means it per "
            "process by design: then it agrees at one process only")


def _count_cause(original: int, migrated: int, world: int) -> str:
    if world > 1 and migrated == original * world:
        return (f"each of the {world} processes went through the whole dataset: the sampler does not shard it "
                "(DistributedSampler(dataset, num_replicas=world_size, rank=rank))")
    if world > 1 and migrated * world == original:
        return (f"the processes took 1/{world} of the original's steps: the dataset was sharded but the "
                "original's global batch was not (the per-process batch is the original's)")
    return "the migrated program took another number of optimizer steps"
