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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


@dataclass
class Verdict:
    run: Run
    steps: int
    divergence: Divergence | None
    tolerance: dict[str, float] = field(default_factory=dict)  # rtol per quantity, noise included


def steps(run: Run) -> list[Step]:
    by_step: dict[tuple[int, int], list[dict]] = {}
    for record in run.records:
        by_step.setdefault((record["optimizer"], record["step"]), []).append(record)
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


def noise(first: list[Step], second: list[Step]) -> dict[str, float]:
    """The largest relative difference of each figure between two runs of the original."""
    worst = dict.fromkeys(QUANTITIES, 0.0)
    for a, b in zip(first, second):
        for quantity in QUANTITIES:
            x, y = a.figures[quantity], b.figures[quantity]
            if x is not None and y is not None:
                worst[quantity] = max(worst[quantity], abs(x - y) / max(abs(x), 1e-12))
    return worst


def verdict(original: list[Step], run: Run, rtol: float, atol: float, floor: dict[str, float]) -> Verdict:
    """`run` against the original's steps: the first step and quantity that differ."""
    tolerance = {q: max(rtol, 10 * floor.get(q, 0.0)) for q in QUANTITIES}
    migrated = steps(run)
    result = Verdict(run, len(migrated), None, tolerance)
    for a, b in zip(original, migrated):
        if b.rank_mismatch:
            quantity = "gradient norm" if b.rank_mismatch.startswith("gradient") else "parameters"
            result.divergence = Divergence(
                run.name, b.index, quantity, a.figures[quantity], b.figures[quantity], b.ranks,
                f"the ranks disagree ({b.rank_mismatch}): each process stepped with its own gradients, not "
                "their average over the processes: wrap the model in DistributedDataParallel, or all-reduce "
                "the gradients with ReduceOp.AVG before the step", b.where)
            return result
        for quantity in QUANTITIES:
            x, y = a.figures[quantity], b.figures[quantity]
            if x is None or y is None:
                continue
            if not _close(x, y, tolerance[quantity], atol):
                result.divergence = Divergence(run.name, b.index, quantity, x, y, b.ranks,
                                               _cause(quantity, x, y, run.world, b.index), b.where)
                return result
    if len(original) != len(migrated):
        result.divergence = Divergence(run.name, None, "optimizer steps", len(original), len(migrated),
                                       sorted({r for s in migrated for r in s.ranks}),
                                       _count_cause(len(original), len(migrated), run.world))
    return result


def shown(value: float | int | None) -> str:
    """A figure as the reports print it."""
    if value is None:
        return "-"
    return f"{value:.8g}" if isinstance(value, float) else str(value)


def noise_text(floor: dict[str, float]) -> str:
    """The original's own run-to-run noise, per figure (the learning rate has none to speak of)."""
    return ", ".join(f"{q} {floor[q]:.1e}" for q in QUANTITIES if q != "learning rate")


def _close(x: float, y: float, rtol: float, atol: float) -> bool:
    return math.isclose(x, y, rel_tol=rtol, abs_tol=atol)


def _cause(quantity: str, original: float, migrated: float, world: int, step: int) -> str:
    ratio = migrated / original if original else math.inf
    if quantity == "learning rate":
        scaled = f"{ratio:.3g} times the original's" + (f", the world size {world}" if math.isclose(ratio, world) else "")
        return (f"the learning rate is {scaled}: the program scales it by the number of processes (by "
                "design where each process reads a batch of its own, the global batch growing with the "
                "world: then its numbers agree at one process only), or a schedule stepped differently")
    if quantity == "gradient norm" and world > 1:
        if math.isclose(ratio, world, rel_tol=0.05):
            return (f"the gradient norm is {world} times the original's: the gradients were summed over the "
                    f"{world} processes, not averaged (ReduceOp.SUM without dividing by the world size)")
        if math.isclose(ratio, 1 / world, rel_tol=0.05):
            return (f"the gradient norm is 1/{world} of the original's: the gradients were averaged over the "
                    "processes twice (an explicit average on top of DistributedDataParallel or FSDP)")
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
    return (f"it agrees at one process and differs at {world}: what differs is how the processes share the "
            "work (the slices they read, the gradient average, a statistic taken over one process's slice), "
            "or the program's numbers depend on the world size by design (a batch per process that is not a "
            "slice of a global one): then they agree at one process only")


def _count_cause(original: int, migrated: int, world: int) -> str:
    if world > 1 and migrated == original * world:
        return (f"each of the {world} processes went through the whole dataset: the sampler does not shard it "
                "(DistributedSampler(dataset, num_replicas=world_size, rank=rank))")
    if world > 1 and migrated * world == original:
        return (f"the processes took 1/{world} of the original's steps: the dataset was sharded but the "
                "original's global batch was not (the per-process batch is the original's)")
    return "the migrated program took another number of optimizer steps"
