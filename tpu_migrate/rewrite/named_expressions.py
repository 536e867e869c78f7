"""Named expressions that rule templates (TOML and code) write as placeholders: `{rank}` and
`{world_size}`, and `{rank_atom}` / `{world_size_atom}` where the expression sits in a larger one
(`{rank_atom} == 0`).

torch_xla answered ranks from its runtime, with or without a process group: without one, the
launcher's environment answers (torchrun sets RANK and WORLD_SIZE; a plain `python train.py`
sets nothing and is one process). A statement (StatementContext.fill) gets, in a worker that
the converted launch always starts in a process group (plans.Plans.joined_workers), what a
reviewer would write there: `dist.get_rank()`; elsewhere a call of a small helper the file gets
once (`_rank()`), rather than the whole expression at every use. Code written as a whole (the
helpers themselves, ImportPlan.fill) gets the expression.

Templates also name helper functions the file gets once: `{map_tensors}` (helper_code.py), so a
TOML rule can use one without code of its own.
"""

from __future__ import annotations

from typing import Callable

from tpu_migrate.rewrite.helper_code import BATCH_SLICE, MAP_TENSORS

_LONG = {
    "rank": '{dist}.get_rank() if {dist}.is_initialized() else int({os}.environ.get("RANK", 0))',
    "world_size": '{dist}.get_world_size() if {dist}.is_initialized() else int({os}.environ.get("WORLD_SIZE", 1))',
}
_IN_GROUP = {"rank": "{dist}.get_rank()", "world_size": "{dist}.get_world_size()"}
NAMES = (*_LONG, *(f"{name}_atom" for name in _LONG))
_HELPERS = {
    "rank": ("_rank", "The global rank, as torch_xla answered it: the process group's, else RANK"),
    "world_size": ("_world_size", "The number of processes, as torch_xla answered it: the group's, else WORLD_SIZE"),
}
_FUNCTIONS = {"map_tensors": ("_map_tensors", MAP_TENSORS), "batch_slice": ("_batch_slice", BATCH_SLICE)}
# The modules a template may name (ImportPlan gives each the file's own name, importing it
# where needed), then every other placeholder a rule table may use besides its `params`.
STDLIB_MODULES = ("copy", "functools", "os", "socket", "time")
# Placeholders for torch's submodules that `import torch` does not import.
TORCH_SUBMODULES = {"fsdp_wrap": "torch.distributed.fsdp.wrap", "dist_optim": "torch.distributed.optim"}
MODULES = ("torch", "dist", "transformers", *TORCH_SUBMODULES, *STDLIB_MODULES, "loguru")
PLACEHOLDERS = frozenset({*MODULES, *NAMES, *_FUNCTIONS, "name"})


def _replace(template: str, name: str, value: str, atom: str) -> str:
    return template.replace("{" + name + "_atom}", atom).replace("{" + name + "}", value)


def expand(template: str, in_group: bool = False) -> str:
    """`template` with its named expressions written out (still holding `{dist}` / `{os}`)."""
    if "{" not in template:
        return template
    for name, long in _LONG.items():
        short = _IN_GROUP[name]
        template = _replace(template, name, short if in_group else long, short if in_group else f"({long})")
    return template


def with_helpers(template: str, helper: Callable[[str, str], str]) -> str:
    """`template` with each named expression it uses as a call of its helper, and each named
    helper function as its name; `helper(base, code)` adds the helper to the file once and
    returns its name."""
    for name, (base, code) in _FUNCTIONS.items():
        if "{" + name + "}" in template:
            template = template.replace("{" + name + "}", helper(base, code))
    for name, (base, doc) in _HELPERS.items():
        if "{" + name in template:
            code = f'def {{name}}():\n    """{doc} (added by tpu-migrate)."""\n    return {_LONG[name]}\n'
            call = f"{helper(base, code)}()"
            template = _replace(template, name, call, call)
    return template
