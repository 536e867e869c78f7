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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpu_migrate.verify import printed
from tpu_migrate.verify.runs import Run

QUANTITIES = ("learning rate", "loss", "gradient norm", "parameters")


@dataclass
class Step:
    optimizer: int
    index: int
    ranks: list[int]
    figures: dict[str, float | None]   # quantity -> value (loss None where no backward was seen)
    where: str | None = None           # the program line that called optimizer.step()
    rank_mismatch: str | None = None   # a whole-tensor figure the ranks disagree on, and how
    unit: str = "step"                 # or "backward call", in a program without optimizer steps


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
    reduced: set[tuple[int, int]] = field(default_factory=set)  # printed numbers a reduction returned

    @property
    def unit(self) -> str:
        return self.steps[0].unit if self.steps else "step"


@dataclass
class Verdict:
    run: Run
    steps: int
    divergence: Divergence | None
    tolerance: dict[str, float] = field(default_factory=dict)  # rtol per quantity, noise included
    printed: printed.Printed | None = None  # None: not compared (the steps differ first)


def original(first: Run, second: Run) -> Original:
    figures = steps(first)
    lines = printed.lines(first.printed)
    return Original(figures, noise(figures, steps(second)), lines, printed.noise(lines, printed.lines(second.printed)),
                    first.once, printed.reduced(lines, first.reduced))


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
        }, where=first.get("where"))
        for key, name, shown in (("grad_sq", "gradient norms", math.sqrt), ("param_sum", "parameters", float)):
            values = [r[key] for r in records]
            if not all(_close(values[0], v, 1e-6, 0.0) for v in values[1:]):
                step.rank_mismatch = f"{name}: " + ", ".join(f"rank {r['rank']} {shown(r[key]):.6g}" for r in records)
                break
        out.append(step)
    return out


def _backward_calls(run: Run) -> list[Step]:
    """Per backward() call of a program that steps no optimizer: its loss, averaged over the ranks."""
    by_rank = {r["rank"]: r["backward"] for r in run.records if "backward" in r}
    calls = min((len(losses) for losses in by_rank.values()), default=0)
    ranks = sorted(by_rank)
    return [Step(0, k, ranks, {"learning rate": None, "loss": sum(by_rank[r][k] for r in ranks) / len(ranks),
                               "gradient norm": None, "parameters": None}, unit="backward call")
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
            one_process_ran: bool = True) -> Verdict:
    """`run` against the original: the first step and quantity that differ; where every step
    agrees, the first printed number. `alone`: the 1-process run's divergence, for a run of more
    processes (its cause must not say that one process agrees); `one_process_ran`: whether there
    was a 1-process run (without one, nothing is said of it)."""
    result = _steps_verdict(reference.steps, run, rtol, atol, reference.floor, alone, one_process_ran)
    if result.divergence is None:
        across, agreed = None, set()
        if run.world > 1:  # every rank's lines: what rank 0's cannot show (printed.py)
            ranks = [(rank, first, printed.lines(text)) for rank, first, text in run.ranks]
            across, agreed = printed.across_ranks(reference.printed, reference.once, reference.reduced, ranks,
                                                  rtol, atol)
        result.printed = printed.compare(reference.printed, printed.lines(run.printed), reference.printed_noise,
                                         rtol, atol, run.world, agreed)
        mismatch = result.printed.divergence or across
        if mismatch is not None:
            cause = _printed_cause(run.world, reference.unit if reference.steps else None, mismatch)
            quantity = "processes that print it" if mismatch.kind == "extra" else "printed number"
            result.divergence = Divergence(run.name, mismatch.line, quantity, mismatch.original,
                                           mismatch.migrated, [mismatch.rank], cause,
                                           f"{mismatch.text}  |  {mismatch.migrated_text}", unit="printed line")
    return result


def _steps_verdict(original: list[Step], run: Run, rtol: float, atol: float, floor: dict[str, float],
                   alone: Divergence | None = None, one_process_ran: bool = True) -> Verdict:
    tolerance = {q: max(rtol, 10 * floor.get(q, 0.0)) for q in QUANTITIES}
    migrated = steps(run)
    result = Verdict(run, len(migrated), None, tolerance)
    for a, b in zip(original, migrated):
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
        for quantity in QUANTITIES:
            x, y = a.figures[quantity], b.figures[quantity]
            if x is None or y is None:
                continue
            if not _close(x, y, tolerance[quantity], atol):
                cause = _cause(quantity, x, y, run.world, b.index, (len(original), len(migrated)), alone,
                               one_process_ran and alone is None)
                result.divergence = Divergence(run.name, b.index, quantity, x, y, b.ranks, cause, b.where, a.unit)
                return result
    if len(original) != len(migrated):
        unit = (original or migrated)[0].unit
        result.divergence = Divergence(run.name, None, "optimizer steps" if unit == "step" else "backward calls",
                                       len(original), len(migrated), sorted({r for s in migrated for r in s.ranks}),
                                       _count_cause(len(original), len(migrated), run.world), unit=unit)
    return result


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


def noise_text(floor: dict[str, float]) -> str:
    """The original's own run-to-run noise, per figure (the learning rate has none to speak of)."""
    return ", ".join(f"{q} {floor[q]:.1e}" for q in QUANTITIES if q != "learning rate")


def _close(x: float, y: float, rtol: float, atol: float) -> bool:
    return math.isclose(x, y, rel_tol=rtol, abs_tol=atol)


def _cause(quantity: str, original: float, migrated: float, world: int, step: int,
           counts: tuple[int, int] = (0, 0), alone: Divergence | None = None, one_process_agreed: bool = True) -> str:
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
