"""Device rules (rules/device.toml): `xm.xla_device()`, "xla" device strings, device-type tests, autocast strings,
and "xla" device / backend names held in data (TPU001-TPU005)."""

from __future__ import annotations

import re

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.helper_code import is_added_helper
from tpu_migrate.rewrite.registry import CALL, emits, transform
from tpu_migrate.rewrite.transforms.common import (
    KEYWORD_EQUAL,
    XLA_DEVICE,
    PORTABLE_DEVICE,
    bind,
    clean_args,
    code,
    helper,
    quote_of,
    runs_spmd,
)

# Where a plain string must stay a string (data, `device_type=`), target portable uses the type
# of the native accelerator ("cpu" without one).
PORTABLE_DEVICE_TYPE = "(" + PORTABLE_DEVICE + ").type"

# `"xla:%d" % i` and `"xla:{}".format(i)`: the index is dropped like in "xla:N".
_XLA_INDEX_FORMAT = re.compile(r"xla:(%[ds]|\{\w*\})\Z")

# Calls whose keyword arguments are data, not a device parameter (`parser.set_defaults(device=...)`).
_DATA_CALLS = frozenset({"dict", "set_defaults", "update", "Namespace", "SimpleNamespace"})
# torch functions whose first positional argument is a device (True: a device *type* string).
_POSITIONAL_DEVICE = {
    "torch.set_default_device": False,
    "torch.amp.autocast": True,
    "torch.amp.autocast_mode.autocast": True,
    "torch.amp.GradScaler": True,
    "torch.amp.grad_scaler.GradScaler": True,
    "torch.get_device_module": True,
    "torch.amp.is_autocast_available": True,
    "torch.is_autocast_enabled": True,
    "torch.get_autocast_dtype": True,
    "torch.set_autocast_dtype": True,
    "torch.set_autocast_enabled": True,
}
# Lookups with a default: `cfg.get(KEY, "xla")`, `os.getenv(KEY, "xla")`, `getattr(o, KEY, "xla")`.
_LOOKUP_METHODS = frozenset({"get", "setdefault", "pop"})

_MESSAGES = {
    ("data", "tpu"): '{s} may name torch_xla\'s device or process-group backend here: TorchTPU\'s '
                     'device is "tpu" and its backend "tpu_dist"; change it if so',
    ("data", "portable"): '{s} may name torch_xla\'s device or process-group backend here: use '
                          'torch.accelerator.current_accelerator().type (or "cpu") for a device and '
                          'None (the default backend) for a backend if so',
    ("compare", "tpu"): 'compares with {s}, torch_xla\'s device or backend name: TorchTPU\'s device '
                        'type is "tpu" and its process-group backend "tpu_dist"; update the test',
    ("compare", "portable"): 'compares with {s}, torch_xla\'s device or backend name: compare a device '
                             'type with (torch.accelerator.current_accelerator() or '
                             'torch.device("cpu")).type and a backend with dist.get_backend() instead',
    # A name that holds a process-group backend: where its "xla" was converted (TPU005, in this
    # file or where the value is set), the test no longer holds; say so, not "may".
    ("compare-backend", "tpu"): 'compares a process-group backend with {s}: this rewrite writes "tpu_dist" '
                                'where a backend held "xla" (TPU005), so this test is false for those '
                                'values now: compare with "tpu_dist"',
    ("compare-backend", "portable"): 'compares a process-group backend with {s}: this rewrite writes the '
                                     'accelerator\'s default backend where a backend held "xla" (TPU005), so '
                                     'this test is false for those values now: test the device '
                                     '(torch.accelerator.current_accelerator()) instead',
}


def is_xla_device_string(node: cst.BaseExpression) -> bool:
    """`"xla"`, `"xla:N"`, `f"xla:{i}"`, `"xla:" + str(i)`, `"xla:%d" % i`, `"xla:{}".format(i)`."""
    if isinstance(node, cst.SimpleString):
        return _value_matches(node, XLA_DEVICE)
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        return (
            len(parts) >= 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "xla:"
            and all(isinstance(p, cst.FormattedStringExpression) for p in parts[1:])
        )
    if isinstance(node, cst.BinaryOperation) and isinstance(node.left, cst.SimpleString):
        if isinstance(node.operator, cst.Add):
            return _value_is(node.left, "xla:")
        if isinstance(node.operator, cst.Modulo):
            return _value_matches(node.left, _XLA_INDEX_FORMAT)
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "format"
        and isinstance(node.func.value, cst.SimpleString)
    ):
        return _value_matches(node.func.value, _XLA_INDEX_FORMAT)
    return False


def _string_value(node: cst.SimpleString) -> str | None:
    try:
        value = node.evaluated_value
    except Exception:  # noqa: BLE001 - odd escapes: not a device string
        return None
    return value if isinstance(value, str) else None


def _value_matches(node: cst.SimpleString, pattern: re.Pattern) -> bool:
    value = _string_value(node)
    return value is not None and bool(pattern.match(value))


def _value_is(node: cst.SimpleString, expected: str) -> bool:
    return _string_value(node) == expected


def device_value(node: cst.BaseExpression, sc: StatementContext, string: bool = False) -> cst.BaseExpression:
    """What an "xla" device string becomes; `string`: a str is needed (data, a device type)."""
    if sc.file.target == "tpu":
        q = quote_of(node) if isinstance(node, (cst.SimpleString, cst.FormattedString)) else '"'
        return cst.SimpleString(f"{q}tpu{q}")
    return parse_expr(sc.file.import_plan.fill(PORTABLE_DEVICE_TYPE if string else PORTABLE_DEVICE))


def backend_value(node: cst.BaseExpression, sc: StatementContext) -> cst.BaseExpression:
    """What the "xla" process-group backend becomes: "tpu_dist"; portable: the default backend's
    name for the accelerator (or the CPU), never None, which a program may read as "not
    distributed" (`if backend is not None:`)."""
    if sc.file.target == "tpu":
        return cst.SimpleString(f"{quote_of(node)}tpu_dist{quote_of(node)}")
    return parse_expr(helper(sc, "_default_backend", DEFAULT_BACKEND) + "()")


DEFAULT_BACKEND = '''def {name}():
    """The default process-group backend for this host's accelerator, or the CPU's ("gloo"), where torch_xla's was "xla" (added by tpu-migrate)."""
    return {dist}.get_default_backend_for_device(''' + PORTABLE_DEVICE + ''')
'''


@transform("device_call", form=CALL)
def device_call(call, qualname, sc: StatementContext, rule):
    index = _device_index(call, qualname)
    if index is not None and not runs_spmd(sc):  # under SPMD torch_xla returned xla:0 for any index
        sc.needs_manual(rule.code, f"this picked device `{code(index)}` of the devices one process drove (one process over "
                        "several TPUs, e.g. a thread per device); TorchTPU binds each process to one TPU, "
                        "its index 0: run one process per device (torchrun) and give each its share",
                        qualname)
        return call
    sc.fixed(rule.code, qualname)
    if sc.file.target == "tpu":
        return parse_expr(sc.file.import_plan.fill('{torch}.device("tpu")'))
    return parse_expr(sc.file.import_plan.fill(PORTABLE_DEVICE))


def _device_index(call: cst.Call, qualname: str) -> cst.BaseExpression | None:
    """The device index the call picks, unless it is absent, None or 0 (the process's own device)."""
    bound = bind(call, ["index"] if qualname == "torch_xla.device" else ["n", "devkind"])
    arg = None if bound is None else bound.get("index") or bound.get("n")
    if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None") or \
            (isinstance(arg.value, cst.Integer) and arg.value.evaluated_value == 0):
        return None
    return arg.value


@transform("device_strings", calls=("torch.device",))
def torch_device_ctor(call: cst.Call, sc: StatementContext):
    """torch.device("xla"), torch.device("xla:1"), torch.device("xla", i)."""
    bound = bind(call, ["type", "index"])
    if bound is None or "type" not in bound or not sc.enabled("TPU002"):
        return call
    arg = bound["type"]
    if not is_xla_device_string(arg.value):
        # `torch.device("xla" if use_tpu else "cpu")`, `torch.device(args.device or "xla")`
        value = _convert(arg.value, "device", sc)
        return call if value is arg.value else call.with_changes(
            args=[a.with_changes(value=value) if a is arg else a for a in call.args]
        )
    sc.fixed("TPU002", where=_where(sc, bound["type"].value))
    if sc.file.target == "tpu":
        value = device_value(bound["type"].value, sc)
        return call.with_changes(args=[cst.Arg(value)])
    return parse_expr(sc.file.import_plan.fill(PORTABLE_DEVICE))


# -- names that say what a value is --------------------------------------------------------


def hint_of(name: str | None, sc: StatementContext) -> str | None:
    """"device" or "backend" (a process group's) when a name (variable, attribute, key,
    keyword, option) says so. A backend name says process group with a word for it
    (`dist_backend`, `ddp_backend`, `--dist-backend`), or plainly (`backend`) in a file that
    starts process groups; `plot_backend` and `attention_backend` say something else."""
    if not name:
        return None
    lower = name.lower()
    device, backend = "device" in lower, "backend" in lower
    if device == backend:
        return None
    if device:
        return "device"
    words = {w.lower() for w in _WORDS.findall(name)}
    if words & _PROCESS_GROUP_WORDS or {"process", "group"} <= words:
        return "backend"
    if words == {"backend"} and starts_process_groups(sc):
        return "backend"
    return None


# The words of a name: `dist_backend`, `--dist-backend`, `distBackend`, `DDP_BACKEND`.
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_PROCESS_GROUP_WORDS = frozenset({
    "dist", "distributed", "ddp", "fsdp", "pg", "comm", "comms", "communication", "collective",
    "collectives", "ccl",
})
_GROUP_STARTS = frozenset({"torch.distributed.init_process_group", "torch.distributed.new_group"})


def starts_process_groups(sc: StatementContext) -> bool:
    """Whether the file starts a process group (or registers torch_xla's backend for one). The
    helpers an earlier run added (`_xmp_worker`, `_join_world`) do not count: they would make a
    second run word its TODOs otherwise than the first (`backend == "xla"` read as a process
    group's backend only once the file holds the helper)."""
    analysis = sc.file.analysis
    found = sc.file.memo.get("starts_process_groups")
    if found is None:
        helpers = [(f.lineno, f.end_lineno) for f in analysis.functions.values() if is_added_helper(f)]
        found = sc.file.memo["starts_process_groups"] = any(
            ref.qualname in _GROUP_STARTS and not any(start <= ref.line <= end for start, end in helpers)
            for info in analysis.infos.values() for ref in info.refs
        ) or any(b.qualname == "torch_xla.distributed.xla_backend" for b in analysis.imports)
    return found


def _target_name(target: cst.BaseExpression) -> str | None:
    """`device`, `args.device`, `self.device`, `config["device"]`."""
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute):
        return target.attr.value
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return _string_value(index.value)
    return None


def _string_hint(node: cst.BaseExpression, sc: StatementContext) -> str | None:
    return hint_of(_string_value(node), sc) if isinstance(node, cst.SimpleString) else None


# The operands a value may come from: `a if c else b`, `a or b`.
_BRANCHES = {cst.IfExp: ("body", "orelse"), cst.BooleanOperation: ("left", "right")}


@emits("TPU002", "TPU005")
def _convert(value: cst.BaseExpression, hint: str, sc: StatementContext, string: bool = True,
             nested: bool = False) -> cst.BaseExpression:
    """A value whose name says device or backend: its "xla" strings converted (the value itself,
    either branch of `a if c else b`, an operand of `or` / `and`, `field(default=...)`)."""
    branches = _BRANCHES.get(type(value))
    if branches:
        changed = {}
        for name in branches:
            part = getattr(value, name)
            new = _convert(part, hint, sc, string, True)
            if new is not part:
                changed[name] = new
        return value.with_changes(**changed) if changed else value
    if isinstance(value, cst.Call) and _callee(value) == "field":
        args = [
            a.with_changes(value=_convert(a.value, hint, sc, string))
            if a.keyword is not None and a.keyword.value == "default" else a
            for a in value.args
        ]
        if all(a is b for a, b in zip(args, value.args)):
            return value
        return value.with_changes(args=args)
    if hint == "backend":
        if not (isinstance(value, cst.SimpleString) and _value_is(value, "xla")) or not sc.enabled("TPU005"):
            return value
        sc.fixed("TPU005", where=_where(sc, value))
        return backend_value(value, sc).with_changes(lpar=value.lpar, rpar=value.rpar)
    if not is_xla_device_string(value) or not sc.enabled("TPU002"):
        return value
    sc.fixed("TPU002", where=_where(sc, value))
    new = device_value(value, sc, string)
    if nested and not string and sc.file.target != "tpu":
        return new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return new


def _convertible(value: cst.BaseExpression, hint: str) -> bool:
    if hint == "backend":
        return isinstance(value, cst.SimpleString) and _value_is(value, "xla")
    return is_xla_device_string(value)


def _callee(call: cst.Call) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None


# -- marking what is not certain -------------------------------------------------------------


def names_xla(node: cst.BaseExpression) -> bool:
    """A literal that names torch_xla's device or backend: "xla", "xla:N" (and "xla:" as a prefix)."""
    if isinstance(node, cst.SimpleString):
        value = _string_value(node)
        return value is not None and (bool(XLA_DEVICE.match(value)) or value == "xla:")
    if isinstance(node, cst.FormattedString):
        return is_xla_device_string(node)
    return False


@emits("TPU004")
def mark(node: cst.BaseExpression, sc: StatementContext, use: str = "data") -> None:
    """TPU004 on the "xla" literals of `node` (itself, or a branch of `a if c else b` / `or`)."""
    if isinstance(node, cst.IfExp):
        mark(node.body, sc, use)
        mark(node.orelse, sc, use)
        return
    if isinstance(node, cst.BooleanOperation):
        mark(node.left, sc, use)
        mark(node.right, sc, use)
        return
    if not names_xla(node) or not sc.enabled("TPU004"):
        return
    shown = f'"{_string_value(node)}"' if isinstance(node, cst.SimpleString) else '"xla:N"'
    message = _MESSAGES[(use, sc.file.target)].format(s=shown)
    sc.needs_manual("TPU004", message, where=_where(sc, node))


def _where(sc: StatementContext, node: cst.BaseExpression) -> tuple[int, int]:
    """The input position of this "xla" literal: the first unconsumed one of the statement that
    is spelled the same, else the next one."""
    return sc.consume_string(node.value if isinstance(node, cst.SimpleString) else None)


# -- the hooks ------------------------------------------------------------------------------


@transform("device_strings", on="arguments")
def device_string_args(call: cst.Call, sc: StatementContext):
    """The "xla" arguments of any call: `.to("xla")`, `device="xla"` (and any keyword that says
    device or backend), argparse defaults, lookups with a default, `torch.amp.autocast("xla")`;
    `.startswith("xla")` is marked."""
    if not sc.info.xla_strings:
        return call
    callee = _callee(call)
    qualname = sc.resolve(call.func)
    data_call = callee in _DATA_CALLS
    option_hint = _argparse_hint(call, sc) if callee == "add_argument" else None
    lookup_key = _lookup_key_index(call, callee, qualname)
    positional = _POSITIONAL_DEVICE.get(qualname or "")
    new_args = list(call.args)
    positional_index = -1
    for i, arg in enumerate(call.args):
        value = arg.value
        new = value
        if arg.keyword is None and not arg.star:
            positional_index += 1
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword in ("device", "map_location") and not data_call:
            new = _convert(value, "device", sc, string=False)
        elif keyword == "default" and option_hint is not None:
            new = _convert(value, option_hint, sc)
        elif keyword is not None:
            # `pin_memory_device=`, `device_type=`, `dist_backend=`: a str keeps its type.
            hint = hint_of(keyword, sc)
            if hint is not None:
                new = _convert(value, hint, sc)
        elif arg.star:
            continue
        elif positional_index == 0 and callee == "to" and isinstance(call.func, cst.Attribute):
            new = _convert(value, "device", sc, string=False)
        elif positional_index == 0 and positional is not None:
            new = _convert(value, "device", sc, string=positional)
        elif lookup_key is not None and positional_index == lookup_key + 1:
            hint = _string_hint(call.args[lookup_key].value, sc)
            if hint is not None and _convertible(value, hint):
                new = _convert(value, hint, sc)
            elif hint is None:
                mark(value, sc)
        elif positional_index == 0 and callee in ("startswith", "endswith"):
            mark(value, sc, "compare")
        if new is not value:
            new_args[i] = arg.with_changes(value=new)
    if all(a is b for a, b in zip(new_args, call.args)):
        return call
    return call.with_changes(args=new_args)


def _argparse_hint(call: cst.Call, sc: StatementContext) -> str | None:
    """What `parser.add_argument("--device", ...)` / `dest="backend"` holds."""
    names = [
        a.value for a in call.args
        if (a.keyword is None or a.keyword.value == "dest") and isinstance(a.value, cst.SimpleString)
    ]
    hints = {hint_of((_string_value(n) or "").lstrip("-"), sc) for n in names} - {None}
    return hints.pop() if len(hints) == 1 else None


def _lookup_key_index(call: cst.Call, callee: str | None, qualname: str | None) -> int | None:
    """Index of the key argument of a lookup with a default, if `call` is one."""
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    if callee == "getattr" and isinstance(call.func, cst.Name) and len(call.args) == 3:
        return 1
    if (callee in _LOOKUP_METHODS and isinstance(call.func, cst.Attribute) or qualname == "os.getenv") and len(
        call.args
    ) == 2:
        return 0
    return None


@transform("device_strings", on="param")
def device_param_default(param: cst.Param, sc: StatementContext) -> cst.Param:
    """`def f(device="xla")`, `device_type="xla"`, `backend="xla"`."""
    if param.default is None or not sc.info.xla_strings:
        return param
    name = param.name.value
    hint = hint_of(name, sc)
    if hint is None:
        return param
    string = hint == "device" and "type" in name.lower()
    default = _convert(param.default, hint, sc, string=string)
    return param if default is param.default else param.with_changes(default=default)


@transform("device_strings", on="assign")
def data_assignment(node, sc: StatementContext):
    """`device = "xla"`, `args.device = ...`, `config["backend"] = ...`, `device: str = "xla"`."""
    if node.value is None or not sc.info.xla_strings:
        return node
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    hints = {hint_of(_target_name(t), sc) for t in targets}
    if len(hints) != 1:
        return node
    hint = hints.pop()
    if hint is None:
        return node
    value = _convert(node.value, hint, sc)
    return node if value is node.value else node.with_changes(value=value)


@transform("device_strings", on="return")
def data_return(node: cst.Return, sc: StatementContext) -> cst.Return:
    """`return "xla"`: a function answering with a device or backend name; marked."""
    if node.value is not None and sc.info.xla_strings:
        mark(node.value, sc)
    return node


@transform("device_strings", on="element")
def data_element(node: cst.Element, sc: StatementContext) -> cst.Element:
    """"xla" in a list, tuple or set: `("cpu", "xla")`, `choices=[...]`; marked."""
    if sc.info.xla_strings:
        mark(node.value, sc)
    return node


@transform("device_strings", on="dict_element")
def data_dict_element(node: cst.DictElement, sc: StatementContext) -> cst.DictElement:
    """A dict value: converted under a key that says device or backend, else marked. Keys
    (`rng_states = {"xla": ...}`) are names, not devices: left alone."""
    if not sc.info.xla_strings:
        return node
    hint = _string_hint(node.key, sc)
    if hint is None:
        mark(node.value, sc)
        return node
    value = _convert(node.value, hint, sc)
    if value is not node.value:
        return node.with_changes(value=value)
    if not _convertible(node.value, hint):
        mark(node.value, sc)
    return node


@transform("device_type_compare", on="comparison", order=2)  # after the guards and the env reads
def device_type_compare(original: cst.Comparison, cmp: cst.Comparison, sc: StatementContext):
    """`x.device.type == "xla"` (TPU003); other comparisons with "xla" are marked (TPU004)."""
    if not sc.info.xla_strings:
        return cmp
    converted = _device_type_compare(cmp, sc)
    if converted is not cmp:
        return converted
    operands = (cmp.left, *(c.comparator for c in cmp.comparisons))
    use = "compare-backend" if any(hint_of(_target_name(o), sc) == "backend" for o in operands) else "compare"
    for operand in operands:
        mark(operand, sc, use)
    return cmp


@emits("TPU003")
def _device_type_compare(cmp: cst.Comparison, sc: StatementContext):
    if len(cmp.comparisons) != 1:
        return cmp
    target = cmp.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
        return cmp
    left, right = cmp.left, target.comparator
    if _is_type_attr(left) and _is_plain_xla(right):
        string_side = "right"
    elif _is_type_attr(right) and _is_plain_xla(left):
        string_side = "left"
    else:
        return cmp
    if not sc.enabled("TPU003"):
        return cmp
    string = right if string_side == "right" else left
    sc.fixed("TPU003", where=_where(sc, string))
    q = quote_of(string)
    operator = target.operator
    if sc.file.target == "tpu":
        new_string = cst.SimpleString(f"{q}tpu{q}")
    else:
        # The type of the device the migration runs on: the accelerator, or the CPU where there
        # is none. `!= "cpu"` answered False there for the very tensors the program put on its
        # device, and the code took its CPU-only branch.
        new_string = parse_expr(sc.file.import_plan.fill(PORTABLE_DEVICE_TYPE))
    if string_side == "right":
        return cmp.with_changes(
            comparisons=[target.with_changes(operator=operator, comparator=new_string)]
        )
    return cmp.with_changes(left=new_string, comparisons=[target.with_changes(operator=operator)])


def _is_type_attr(node) -> bool:
    """`X.type` where X is clearly a device: `t.device`, a name that says device (`device`,
    `self._device`, `DEVICE`, `devices[0]`), `torch.device(...)`, `xm.xla_device()`. Any other
    `.type` (`config.type`, `job.type`) is compared with "xla" for its own reasons: marked."""
    if not (isinstance(node, cst.Attribute) and node.attr.value == "type"):
        return False
    owner = node.value
    if isinstance(owner, cst.Subscript):
        owner = owner.value
    if isinstance(owner, cst.Call):
        owner = owner.func
    if isinstance(owner, cst.Attribute):
        owner = owner.attr
    return isinstance(owner, cst.Name) and "device" in owner.value.lower()


def _is_plain_xla(node) -> bool:
    return isinstance(node, cst.SimpleString) and is_xla_device_string(node)


@transform("device_strings", calls=("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"))
def autocast(call: cst.Call, sc: StatementContext):
    """`torch.autocast("xla")`: the device type converted. Without `dtype=`, torch_xla's autocast
    used bfloat16 (torch.get_autocast_dtype("xla")), as TorchTPU's "tpu" does; for target
    portable the dtype is given, since CUDA's default is float16 (the CPU's is bfloat16)."""
    bound = bind(call, ["device_type", "dtype", "enabled", "cache_enabled"])
    if bound is None or "device_type" not in bound or not sc.enabled("TPU002"):
        return call
    arg = bound["device_type"]
    if not is_xla_device_string(arg.value):
        value = _convert(arg.value, "device", sc)  # `"xla" if use_tpu else "cpu"`
        if value is arg.value:
            return call
    else:
        sc.fixed("TPU002", where=_where(sc, arg.value))
        value = device_value(arg.value, sc, string=True)
    args = [a.with_changes(value=value) if a is arg else a for a in call.args]
    if sc.file.target != "tpu" and "dtype" not in bound:
        bf16 = parse_expr(sc.file.import_plan.fill("{torch}.bfloat16"))
        args = [*clean_args(args)[:-1], args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(keyword=cst.Name("dtype"), value=bf16,
                        equal=KEYWORD_EQUAL, comma=args[-1].comma)]
    return call.with_changes(args=args)
