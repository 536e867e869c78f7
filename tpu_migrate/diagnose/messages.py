"""What each finding says: its one-line message and its explanation (what happened, why it
costs, what to do), per kind and backend, from what was measured (analysis.py finds them)."""

from __future__ import annotations

from collections import Counter

from tpu_migrate.diagnose import guards
from tpu_migrate.diagnose.dynamo_hooks import CALLED_HERE
from tpu_migrate.diagnose.finding import Finding
from tpu_migrate.diagnose.locations import exchange_of, relative


def describe(f: Finding, backend_name: str = "xla") -> tuple[str, str]:
    """(message, explanation) of a finding: by its kind, then by the backend that found it."""
    where = f"{relative(f.file)}:{f.line}"
    if f.kind in NATIVE_DESCRIPTIONS:
        return NATIVE_DESCRIPTIONS[f.kind](f, where)
    if backend_name in ("native", "standin") and f.kind in _NATIVE_OVERRIDES:
        return _NATIVE_OVERRIDES[f.kind](f, where)
    if f.kind == "recompile":
        # Dynamo's reason (native) names the op; torch_xla's recompiles have none, or a host read.
        return (_dynamo_recompile if f.op not in (None, "host read") else _xla_recompile)(f, where)
    if f.kind == "compile":
        return (_changed_once if f.op == "changed once" else _first_compile)(f, where)
    return _DESCRIPTIONS.get(f.kind, _fallback)(f, where)


def _dynamo_recompile(f: Finding, where: str) -> tuple[str, str]:
    what = _compiled_what(f)
    guard = guards.shape_guard(f.changed)
    if guard is not None:
        shapes = [g for g in map(guards.shape_guard, f.reasons) if g is not None]
        seen = guards.pattern(shapes) if len(shapes) > 1 else None
        origin = f.changed.partition("; ")[2]  # "the new shape comes from train.py:12 (fed by line 11)"
        return (f"torch.compile recompiled {what} {f.count} time(s) for a new input shape at "
                f"{where}{_when(f)}: {guard.describe()}" + (f"; {origin}" if origin else "")
                + (f"; {seen}" if seen else "") + _callers(f),
                "TorchTPU compiles with dynamic=False: every new input shape is a new graph to "
                "compile, up to Dynamo's recompile limit (8), after which the function runs "
                "eagerly, silently. (On the CPU, Dynamo's automatic dynamic shapes hide this; "
                "diagnose compiles as TorchTPU does.) Give the input a fixed shape (pad or "
                "bucket lengths, DataLoader(drop_last=True)), or mark the dimension dynamic "
                "with torch._dynamo.mark_dynamic.")
    return (f"torch.compile recompiled {what} {f.count} time(s) at {where}{_when(f)}: {f.changed}",
            "A guard of the compiled code failed, so Dynamo traced and compiled it again. A "
            "changing Python number or object: pass it as a tensor, or keep it constant.")


def _xla_recompile(f: Finding, where: str) -> tuple[str, str]:
    after = "" if f.per_call else "after warm-up "
    message = f"recompiled {f.count} time(s) {after}at {where}{_when(f)}"
    if f.changed:
        message += f": {f.changed}"
    if f.op == "host read":
        return message, ("A host read of a tensor before the step's sync (.item(), print, bool()) "
                         "cuts the lazy graph here, and the cut moves with pending work: read the "
                         "value after torch_xla.sync(), or in xm.add_step_closure.")
    return message, ("The graph traced at this line changed after warm-up. Usual causes: an "
                     "input whose shape changes (a shorter last batch: DataLoader(drop_last=True); "
                     "variable sequence lengths: pad or bucket them), or a Python number that "
                     "changes every step and is baked into the graph (pass it as a tensor).")


def _compiled_what(f: Finding) -> str:
    return "the compiled code called here" if f.op == CALLED_HERE else f"`{f.op}`"


def _native_second_graph(f: Finding, where: str) -> tuple[str, str]:
    return (f"torch.compile compiled a second graph of {_compiled_what(f)} at {where} (step {f.first_step}): "
            f"{f.changed}",
            "Information: the function was called with the grad mode changed (evaluation under "
            "torch.no_grad()), which Dynamo compiles as a graph of its own, once; a TPU does the "
            "same. Nothing to fix unless it repeats.")


def _native_dynamic_shape(f: Finding, where: str) -> tuple[str, str]:
    if f.count == 0:  # found in the source only (see native._report_dynamic_calls)
        return (f"data-dependent shape `{f.op}` at {where} (found in the source: calls of "
                f"torch.{f.op} are not counted once the program compiles)",
                "The output's shape depends on the values: on a TPU the host waits for the device "
                "to learn it, and under torch.compile it breaks the graph or recompiles per shape. "
                "Prefer fixed-shape forms: torch.where(mask, x, 0), masked sums, padding to a "
                "maximum size.")
    return (f"data-dependent shape `{f.op}` at {where}: {f.count} time(s)",
            "The output's shape depends on the values: the host waits for the device to learn "
            "it, and under torch.compile it breaks the graph or recompiles per shape. Prefer "
            "fixed-shape forms: torch.where(mask, x, 0), masked sums, padding to a maximum size.")


def _changed_once(f: Finding, where: str) -> tuple[str, str]:
    return (f"the graph at {where} changed once in step {f.first_step}: {f.changed}",
            "Information: a one-time change after the first use, not a recompile that "
            "repeats; if it repeats it is reported as a recompile.")


def _closure_read(f: Finding, where: str) -> tuple[str, str]:
    method = f.op.strip("_")
    waits = ("in a background thread (run_async=True): the training loop does not wait for it"
             if f.changed == "async" else
             "at the step's sync (run_async=False): the host waits for that step to finish "
             "on the device before it traces the next one")
    message = f"host read `{method}` in a step closure at {where}: {f.count} time(s) in {f.step_count} steps"
    if f.runs_graph:
        return (message + "; it computes on the device first",
                "The xm.add_step_closure callback computes on the device before it reads "
                "(the tensor it reads is not one the step computed): it runs a small graph of "
                "its own each time, compiled the first time, after the step's graph, "
                f"{waits}. It does not cut the step's graph. Read the step's own tensors in the "
                "closure and do the arithmetic on the host (or in the step), and throttle it "
                "(every N steps) if the wait shows.")
    return (message,
            "Information: an xm.add_step_closure callback runs after the step's graph has "
            "executed, so this read neither cuts the graph nor compiles; it copies an already "
            f"computed value, {waits}. Throttle it (every N steps) if the wait shows.")


def _first_compile(f: Finding, where: str) -> tuple[str, str]:
    return (f"first compile of a new graph after warm-up at {where} (step {f.first_step})",
            "Information: a graph first seen after warm-up, such as an evaluation step. "
            "Expected once; if it repeats it is reported as a recompile.")


def _sync(f: Finding, where: str) -> tuple[str, str]:
    every, when = _sync_when(f)
    message = f"host sync `{f.op.strip('_')}` at {where}: {f.count} time(s) {when}"
    if _in_exchange(f):
        return (message,
                "xm.mesh_reduce and xm.rendezvous exchange Python values between the "
                "processes, so they read their tensors on the host by design: call them after "
                "the training steps (once per epoch, at the end); to reduce a tensor in every "
                "step, xm.all_reduce keeps it on the device, to be read once.")
    return (message,
            f"The host waits for the device to finish before it can read the value, "
            f"{'every step' if every else 'each time'}. Log less often, accumulate on the "
            "device and read every N steps, or move the read into xm.add_step_closure.")


def _dynamic_shape(f: Finding, where: str) -> tuple[str, str]:
    return (f"data-dependent shape `{f.op}` at {where}: {f.count} time(s)",
            "The output's shape depends on the values, so XLA cannot compile it ahead: it "
            "runs on the CPU with a device round trip, and shapes that differ recompile. "
            "Prefer fixed-shape forms: torch.where(mask, x, 0), masked sums, padding to a "
            "maximum size.")


def _fallback(f: Finding, where: str) -> tuple[str, str]:
    place = f"at {where}" if f.exact else f"in the step ending at {where} (--explain gives the line)"
    return (f"`{f.op}` fell back to the CPU {f.count} time(s) {place}",
            f"{f.op} has no XLA lowering: it ran on the CPU, with a copy to the host and back. "
            "Replace it with an op that has one, or move it out of the training step.")


def _sync_when(f: Finding) -> tuple[bool, str]:
    """(whether a sync was read in every step, when it was, as measured)."""
    if f.per_call:
        return False, "at this line, in a loop (no steps found)"
    if f.loop == "after the last":
        return False, "in a loop after the last step (generation or evaluation after training)"
    if f.loop is not None:
        return False, f"in a loop within step {f.first_step} (not step after step)"
    every = f.step_count >= f.total_steps - 1  # the first step's read may come before its end
    return every, (f"in {f.step_count} steps" if not f.total_steps else "every step" if every
                   else f"in {f.step_count} of {f.total_steps} steps (not every step)")


def _in_exchange(f: Finding) -> bool:
    """A read inside xm.mesh_reduce / xm.rendezvous (their value goes through the host)."""
    return exchange_of(f.via) is not None


def _native_sync(f: Finding, where: str) -> tuple[str, str]:
    every, when = _sync_when(f)
    message = f"host sync `{f.op.strip('_')}` at {where}: {f.count} time(s) {when}"
    if f.placement_unknown:
        message += "; could not tell whether the tensor read would live on the TPU"
    if f.op == "torch.save":
        return (message,
                "torch.save copies every tensor on the TPU to the host before it writes: the host "
                f"waits for all queued work and for the copies, {'every step' if every else 'each time'}. "
                "Save every N steps or at the end; for a large model, "
                "torch.distributed.checkpoint.async_save writes in the background.")
    if f.library_reads:
        message += "; inside library code: " + _library_sites(f.library_reads)
        return message, _library_read_advice(f, every)
    return (message,
            f"The host waits for the TPU to finish all queued work before it can read the value, "
            f"{'every step' if every else 'each time'} (and in TorchTPU's fused eager mode it also "
            "cuts the fused graph). Log less often: accumulate on the device and read every N "
            "steps, or copy with .to('cpu', non_blocking=True) and read it a step later."
            + ("" if every or f.loop else " A read in evaluation or logging steps only costs less than one in "
               "every step.")
            + (" Outside the training steps a loop reads as often: read once after it (collect the "
               "values on the device, then one .tolist())." if f.loop else "")
            + (" With the CPU standing in, the source did not show whether this tensor is moved "
               "to the device (.to(device), device=) or made on the host: a host tensor's read "
               "waits for nothing." if f.placement_unknown else ""))


LIBRARY_SITES_SHOWN = 3


def _library_sites(reads: dict) -> str:
    """"18 at transformers/generation/utils.py:2505 in _has_unfinished_sequences, 3 at ...", the
    most frequent first."""
    ordered = sorted(reads.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{count} at {site}" for site, count in ordered[:LIBRARY_SITES_SHOWN])
    more = len(ordered) - LIBRARY_SITES_SHOWN
    return shown + (f" and {more} more place(s)" if more > 0 else "")


def _library_read_advice(f: Finding, every: bool) -> str:
    """What the user can change about reads a library makes in the call their line made."""
    waits = (f"The library your line calls reads the device {'every step' if every else 'each time'}: the "
             "host waits for the TPU to finish all queued work before each read (and in TorchTPU's "
             "fused eager mode each read also cuts the fused graph). ")
    if any("generation/utils.py" in site for site in f.library_reads):
        return waits + (
            "Transformers' generate checks after every generated token whether all sequences have "
            "finished (a bool() of a device tensor), so each call reads the device once per token, and a "
            "few times more to prepare. Generate fewer tokens (max_new_tokens), fewer calls (batch "
            "the prompts: one check per token serves the whole batch), and make each token one "
            "compiled graph (a static cache, cache_implementation=\"static\", with the model "
            "compiled), so each read waits for one graph rather than many small ops.")
    return waits + ("Look in the library's options for a way to read less often (a logging or "
                    "checking interval), or call it less often with more work per call.")


def _when(f: Finding) -> str:
    return "" if f.per_call else f" (first in step {f.first_step})"


def _graph_break(f: Finding, where: str) -> tuple[str, str]:
    gb = f" ({f.changed}: https://meta-pytorch.github.io/compile-graph-break-site/gb/{f.changed.lower()}.html)" \
        if f.changed else ""
    fix = f"Dynamo's hint: {f.hint}" if f.hint else "See the graph-break page for the fixes."
    return (f"graph break at {where}: {f.op}{gb}; traced {f.count} time(s)",
            "torch.compile splits the function here: the code before and after compiles as "
            "separate graphs and this line runs in Python between them, every call. A host read "
            "(.item(), print, `if tensor`) also waits for the device. Keep it out of the compiled "
            f"function, or fix it. {fix}")


def _recompile_limit(f: Finding, where: str) -> tuple[str, str]:
    return (f"torch.compile gave up on the function at {where}: it hit {f.op} "
            f"(last reason: {f.changed})",
            "Dynamo recompiled this function until its limit and now runs it eagerly, silently: "
            "it is no longer compiled. Remove the cause of the recompiles (see the recompile "
            "findings) rather than raising the limit.")


def _unsupported_op(f: Finding, where: str) -> tuple[str, str]:
    seen = (f"in {f.count} graph(s) torch.compile captured, at {where}" if f.changed == "compiled"
            else f"called {f.count} time(s) at {where} (in the sampled warm-up steps)")
    return (f"`{f.op}` has no TorchTPU kernel: {seen}",
            f"TorchTPU 0.2.0 has no kernel for {f.op} on the tpu device and no composite kernel "
            "covers it (rules/torchtpu-ops.json): it raises \"operator ... is not implemented for "
            "TPU\", or with enable_cpu_fallback runs on the CPU with a copy each way. Replace it "
            "with a supported op, or compute it on CPU tensors outside the step.")


def _tpu_incompatible(f: Finding, where: str) -> tuple[str, str]:
    advice = {
        "fork start method": "TorchTPU cannot be used in a forked process: use "
                             "multiprocessing.get_context('spawn') or torch.multiprocessing.spawn.",
        "torch.compile(dynamic=True)": "The TPU backend raises NotImplementedError for dynamic=True: "
                                       "drop it (static shapes), or mark single dimensions dynamic.",
        "torch.compile(backend='inductor')": "backend='inductor' raises RuntimeError on TPU tensors: "
                                             "pass backend='tpu' or no backend.",
        "torch.compile under torch.inference_mode()": "Compiled code run under torch.inference_mode() "
                                                      "crashes on TorchTPU: use torch.no_grad() instead "
                                                      "(the same gradient-free compute).",
    }
    text = advice.get(f.op)
    if text is None and f.op.startswith("generate's own torch.compile("):
        text = ("On a TPU, Transformers' generate compiles the model's forward itself when the cache is "
                "static (its auto-compile covers the tpu device), with generation_config.compile_config: "
                "by default backend='inductor' and mode='reduce-overhead', and TorchTPU raises on both "
                "(backend='inductor' with TPU tensors, any mode=). Set disable_compile=True in the "
                "generation config and compile the forward yourself (torch.compile(model.forward): "
                "TorchTPU's defaults are backend 'tpu' and dynamic=False).")
    if text is None and f.op.startswith("torch.compile(mode="):
        text = "Any mode= raises TypeError on the TPU backend: remove it."
    if text is None and f.op.startswith("torch.tpu."):
        from tpu_migrate.diagnose.incompatible import LEGACY_DEVICE_API

        name = f.op[len("torch.tpu."):].rstrip("()")
        text = (f"On TorchTPU, {f.op} raises RuntimeError from user code (it is internal to the "
                f"framework): call {LEGACY_DEVICE_API.get(name, 'torch.accelerator.*')} instead.")
    if text is None:
        text = ("A TorchTPU process is bound to one device and sees it as tpu:0: use "
                "torch.device('tpu') and start one process per device.")
    return f"`{f.op}` raises on TorchTPU, at {where}", text


NATIVE_DESCRIPTIONS = {"graph-break": _graph_break, "recompile-limit": _recompile_limit,
                       "unsupported-op": _unsupported_op, "tpu-incompatible": _tpu_incompatible}
# What the native backend says differently for a kind both backends report (native.py: a second
# graph of a compiled function, a read of a tensor, a data-dependent shape).
_NATIVE_OVERRIDES = {"compile": _native_second_graph, "sync": _native_sync, "dynamic-shape": _native_dynamic_shape}
# The rest by kind; anything else is a CPU fallback.
_DESCRIPTIONS = {"closure-read": _closure_read, "sync": _sync, "dynamic-shape": _dynamic_shape}


def _callers(f: Finding) -> str:
    """"; recompiled from train.py:50 (2 of 3), eval.py:80 (1 of 3)": the lines that called a
    compiled function whose recompiles came from more than one (a training and an evaluation
    call); "" for one."""
    counted = Counter(f.callers)
    if len(counted) < 2:
        return ""
    total = sum(counted.values())
    return "; recompiled from " + ", ".join(f"{relative(c.rsplit(':', 1)[0])}:{c.rsplit(':', 1)[1]} ({n} of {total})"
                                             for c, n in counted.most_common())
